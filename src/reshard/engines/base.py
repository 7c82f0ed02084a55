"""The interface between the collectives and an engine.

An engine offers a few primitives on 1-D buffers (``alltoallv``, ``allgather``, the small
``allgather_bytes`` of the check, the ``allreduce_max`` of its vote) and its own *form* of the all-to-all: how it moves the
pieces of one layout exchange with the fewest copies it can (gloo: one message per peer; NCCL:
one call on a packed buffer; MPI: subarray datatypes, or bytes with the own piece kept out).
The collectives ask for a form once per call signature and run it on every replay.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from ..execution.stats import Tally
from ..planning.steps import AllToAll


class CallState(Protocol):
    """What an exchange form reads from the call it runs in."""

    op: str
    rank: int
    size: int
    arrays: Any  # the array backend (``reshard.execution.arrays``) of the tensors in flight
    tally: Tally
    primitives: Engine


# run(call, x, prepared=None) -> result; ``prepared`` is what ``prepare_send`` returned, if anything
ExchangeRun = Callable[..., Any]


class Engine(Protocol):
    """An engine's primitives, held by a communicator as ``comm.primitives``: ``name`` in {"gloo",
    "nccl", "mpi"}, this rank, the group size."""

    name: str
    rank: int
    size: int
    timeout: float
    arrays_name: str  # the array library its buffers are in ("torch" or "numpy")
    arrays: Any  # that library's array backend (``reshard.execution.arrays``)
    concurrent_groups: bool  # collectives of two of its groups may run at once on two threads

    def alltoallv(self, recv: Any, send: Any, recv_counts: Sequence[int], send_counts: Sequence[int], what: str) -> None:
        """1-D uint8 ``send`` segment j to rank j; rank i's segment into ``recv`` segment i."""

    def allgather(self, recv: Any, send: Any, what: str) -> None:
        """Every rank's ``send`` (equal byte lengths), stacked in rank order into ``recv``."""

    def allgather_bytes(self, send: Any, what: str) -> Any:
        """numpy uint8 [L] -> numpy uint8 [size, L] (the check's records, the MoE counts)."""

    def start_allgather_bytes(self, send: Any, what: str) -> Callable[[], Any]:
        """``allgather_bytes`` begun now; calling the result finishes it."""

    def allreduce_max(self, values: Any, what: str) -> Any:
        """numpy int64 [k] -> numpy int64 [k], the elementwise max over ranks (the replay vote)."""

    def start_allreduce_max(self, values: Any, what: str) -> Callable[[], Any]:
        """``allreduce_max`` begun now; calling the result finishes it."""

    def all_to_all_form(self, call: CallState, x: Any, geometry: AllToAll) -> ExchangeRun:
        """This engine's way of running ``geometry`` for inputs like ``x``, worked out once."""

    def boxes_form(self, call: CallState, x: Any, step: Any) -> Callable[..., None] | None:
        """Optional (MPI): ``exchange(call, x, out)`` moving a mesh exchange's boxes
        (``steps.ExchangeBoxes``) in one collective call; None leaves ``exchange_pairs``."""

    def prepare_send(self, call: CallState, x: Any, split_dim: int, send_sizes: Sequence[int]) -> Callable[[], Any] | None:
        """The pack as a job to run while the check's records travel, where this engine's form
        packs before its exchange; None where it does not (its result is the form's ``prepared``)."""

    def exchange_pairs(self, recvs: Sequence[tuple[int, Any]], sends: Iterable[tuple[int, Any]], what: str,
                       tally: Tally | None = None) -> None:
        """Point-to-point messages: each ``(peer, buffer)`` of ``recvs`` received, each one ``sends``
        yields sent as it yields it; at most one message per pair of ranks and direction. Memory
        the engine takes for them is noted in ``tally``."""

    def send_buffer(self, count: int, like: Any) -> Any:
        """A 1-D buffer of ``count`` elements like ``like`` for the next exchange's packed
        messages, where the engine reads them from a place of its own; else None. Its growth is
        noted by ``exchange_pairs``, in that exchange's ``tally``."""

    def subgroup(self, groups: Sequence[Sequence[int]]) -> Engine:
        """Collective: the engine of this rank's group among ``groups`` (disjoint, covering)."""

    def barrier(self) -> None: ...

    def close(self) -> None: ...
