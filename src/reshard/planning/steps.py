"""The typed steps of a plan: a small closed set, each one rank's part of one collective.

A step holds what its rank needs to run it and nothing about other ranks' parts beyond its own
peers (its sends and receives), so a plan is as large as the rank's own pieces. ``planner``
makes them, ``execute`` runs them in one loop through the engine's primitives. Shapes are
local shapes (this rank's tensors); ``collective`` names the step as ``rs.last_exchange()``
and ``reshard plan --rank`` report it. Pure: no engine, no array library.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

Shape = tuple[int, ...]
Box = tuple[tuple[int, int], ...]


def with_dim(shape: Sequence[int], dim: int, size: int) -> Shape:
    return tuple(size if d == dim else int(s) for d, s in enumerate(shape))


@dataclass(frozen=True)
class AllToAll:
    """``x`` of ``in_shape`` cut along ``split_dim`` into ``send_sizes`` (piece j to rank j);
    rank i's piece for this rank has the shape ``recv_base`` with ``recv_lengths[i]`` along
    ``concat_dim`` (``recv_shapes[i]``); what arrives is concatenated along ``concat_dim`` in
    rank order into ``out_shape``. The engine runs it as its own collective (NCCL
    all_to_all_single, MPI Alltoallw with subarray datatypes, gloo pairs or shared memory)."""

    collective: ClassVar[str] = "all_to_all"
    in_shape: Shape
    split_dim: int
    concat_dim: int
    send_sizes: tuple[int, ...]
    recv_base: Shape
    recv_lengths: tuple[int, ...]

    @functools.cached_property
    def recv_shapes(self) -> tuple[Shape, ...]:
        return tuple(with_dim(self.recv_base, self.concat_dim, k) for k in self.recv_lengths)

    @functools.cached_property
    def out_shape(self) -> Shape:
        return with_dim(self.recv_base, self.concat_dim, sum(self.recv_lengths))

    def reverse(self) -> AllToAll:
        """The exchange back: each piece returns to the rank it came from."""
        return AllToAll(self.out_shape, self.concat_dim, self.split_dim, self.recv_lengths, self.in_shape,
                        self.send_sizes)


@dataclass(frozen=True)
class AllToAllV:
    """Rows along dim 0 in ``segments``: each ``(send_rows, recv_rows)`` is one variable
    exchange (``send_rows[j]`` rows to rank j, ``recv_rows[i]`` from rank i, in rank order),
    the segments one after the other in both the input and the result."""

    collective: ClassVar[str] = "all_to_all_v"
    segments: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]
    total_rows: int = 0  # every rank's rows together, where every rank knows them alike (else 0)

    def reverse(self) -> AllToAllV:
        return AllToAllV(tuple((recv, send) for send, recv in self.segments), self.total_rows)


@dataclass(frozen=True)
class AllGather:
    """Every rank's piece (``lengths[i]`` long along ``dim``) concatenated in rank order on every
    rank. ``dim=None``: the pieces are runs of the flattened tensor, the result has ``shape``."""

    collective: ClassVar[str] = "all_gather"
    dim: int | None
    lengths: tuple[int, ...]
    shape: Shape | None = None


@dataclass(frozen=True)
class Gather:
    """As ``AllGather`` along ``dim``, onto rank ``root`` only (the others get None)."""

    collective: ClassVar[str] = "gather"
    dim: int
    lengths: tuple[int, ...]
    root: int


@dataclass(frozen=True)
class ReduceScatter:
    """Every rank's ``x`` reduced with ``op`` in rank order; this rank keeps its balanced shard
    along ``dim`` (``dim=None``: of the flattened tensor)."""

    collective: ClassVar[str] = "reduce_scatter"
    dim: int | None
    op: str


@dataclass(frozen=True)
class Reorder:
    """No traffic: the pieces of ``x`` along ``dim`` (``lengths`` long, in order) put in the
    order ``order`` (piece ``order[i]`` first...), one copy. A two-level exchange's first move:
    what goes to each local rank becomes one run."""

    collective: ClassVar[str] = "local"
    dim: int
    lengths: tuple[int, ...]
    order: tuple[int, ...]

    def reverse(self) -> Reorder:
        back = [0] * len(self.order)
        for i, piece in enumerate(self.order):
            back[piece] = i
        return Reorder(self.dim, tuple(self.lengths[o] for o in self.order), tuple(back))


@dataclass(frozen=True)
class ExchangeBoxes:
    """One exchange of boxes over a mesh: the rank's input covers ``held``, its result
    ``target``; ``sends``/``recvs`` are (peer, box) ascending by peer, ``kept`` the boxes of
    its own input that stay; with ``fill_op`` the rest of the result holds op's identity.
    ``moves``: whether any rank moves data (else the step is local work on every rank);
    ``gathers``: whether it only gathers (named all_gather, else all_to_all)."""

    held: Box
    target: Box
    sends: tuple[tuple[int, Box], ...]
    recvs: tuple[tuple[int, Box], ...]
    kept: tuple[Box, ...]
    fill_op: str | None = None
    moves: bool = True
    sources: tuple[tuple[int, Box], ...] = ()  # (peer, the box its input covers) of each peer in ``recvs``
    shape: tuple[int, ...] = ()  # the global tensor's shape
    gathers: bool = False  # every rank's result covers all it holds: the exchange is an all_gather

    @property
    def collective(self) -> str:
        if not self.moves:
            return "local"
        return "all_gather" if self.gathers else "all_to_all"


@dataclass(frozen=True)
class OnMeshDim:
    """``steps`` run among the ranks that differ from this one only on ``mesh_dim`` (its
    sub-communicator), reported as one step named ``name`` (a mesh dim's reduction)."""

    mesh_dim: int
    name: str
    steps: tuple[Step, ...]

    @property
    def collective(self) -> str:
        return self.name

    def reverse(self) -> OnMeshDim:
        return OnMeshDim(self.mesh_dim, self.name, tuple(s.reverse() for s in reversed(self.steps)))


Step = AllToAll | AllToAllV | AllGather | Gather | ReduceScatter | Reorder | ExchangeBoxes | OnMeshDim


@dataclass(frozen=True)
class RankPlan:
    """The steps rank ``rank`` of ``size`` runs for one call of ``op``, in order."""

    op: str
    rank: int
    size: int
    steps: tuple[Step, ...]

    def reverse(self) -> RankPlan:
        """The backward of an exchange-only plan: each step reversed, in reverse order."""
        return RankPlan(f"{self.op} (backward)", self.rank, self.size, tuple(s.reverse() for s in reversed(self.steps)))
