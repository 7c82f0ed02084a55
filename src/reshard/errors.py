"""The errors reshard raises. Every one is a ``ReshardError``.

A collective that fails raises the same class on every rank, with a message naming the rank(s)
at fault, so a job never ends with one rank reporting and the others hanging.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def ranks_text(ranks: Iterable[int], word: bool = True) -> str:
    """``rank 2``, ``ranks 0, 2`` or ``ranks 0-3`` (runs of three or more as ranges): how every
    message names a set of ranks."""
    ranks = sorted(ranks)
    parts: list[str] = []
    i = 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        parts.append(f"{ranks[i]}-{ranks[j]}" if j - i >= 2 else ", ".join(map(str, ranks[i:j + 1])))
        i = j + 1
    body = ", ".join(parts)
    if not word:
        return body
    return ("rank " if len(ranks) == 1 else "ranks ") + body


class RankNames:
    """How messages name a communicator's ranks: as the world (the job) numbers them, with the
    rank in the communicator beside, where the two differ (a mesh dim's communicator:
    ``rank 2 (tp rank 0)``). ``world[q]`` is rank q's world rank; None: the world itself."""

    def __init__(self, world: Sequence[int] | None = None, label: str = ""):
        world = None if world is None else [int(w) for w in world]
        # the world's own numbering, as given: named as the world, with nothing beside
        self.world = None if world == list(range(len(world or []))) else world
        self.label = label

    def world_rank(self, rank: int) -> int:
        return rank if self.world is None else self.world[rank]

    def one(self, rank: int) -> str:
        return self.many([rank])

    def many(self, ranks: Iterable[int]) -> str:
        ranks = sorted(ranks)
        if self.world is None:
            return ranks_text(ranks)
        inside = f"{self.label} {ranks_text(ranks)}" if self.label else f"{ranks_text(ranks)} here"
        return f"{ranks_text(self.world_rank(q) for q in ranks)} ({inside})"


WORLD = RankNames()  # a world communicator's ranks, named by their own numbers


class ReshardError(Exception):
    """Base class of every error reshard raises on purpose."""


class InvalidArgument(ReshardError, ValueError):
    """An argument is wrong on some rank: a dim out of range, split sizes that do not add up..."""


class UnsupportedDType(InvalidArgument, TypeError):
    """The dtype cannot be used with this operation (e.g. summing bools)."""


class MismatchError(ReshardError, ValueError):
    """Ranks passed arguments that must agree but do not (shape, dtype, op, split sizes...)."""


class RankFailed(ReshardError, RuntimeError):
    """A rank died, raised, or did not finish in time.

    ``failures`` maps rank -> a text (traceback or reason) for every rank that failed, and
    ``ranks`` lists them. From ``rs.spawn``, ``culprits`` are the ranks whose own code failed
    (raised, ended, overran, or returned while others waited for them) and ``stopped`` the ranks
    that failed only because of them; the message leads with the culprits. Raised inside a rank
    (a peer's process ended), ``failures`` names the peers that were found gone.
    """

    def __init__(self, message: str, failures: dict[int, str] | None = None,
                 culprits: list[int] | None = None, stopped: list[int] | None = None):
        super().__init__(message)
        self.failures: dict[int, str] = dict(failures or {})
        self.culprits: list[int] = sorted(self.failures) if culprits is None else list(culprits)
        self.stopped: list[int] = list(stopped or [])

    @property
    def ranks(self) -> list[int]:
        return sorted(self.failures)


class CommTimeout(ReshardError, TimeoutError):
    """A wait for other ranks ran out of time."""


class MissingDependency(ReshardError, ImportError):
    """A library that an engine or an option needs is not installed; the message names the
    extra that installs it (reshard's ``[torch]`` extra, say)."""


_ON_EVERY_RANK: dict[type, type] = {}


def on_every_rank(cls: type[ReshardError]) -> type[RankFailed]:
    """The ``RankFailed`` that ``rs.spawn`` raises when every rank failed with ``cls``: an
    instance of both, so ``except rs.MismatchError`` around ``rs.spawn`` catches it."""
    if issubclass(cls, RankFailed):
        return cls
    if cls not in _ON_EVERY_RANK:
        doc = f"{cls.__name__} raised on every rank of a job (also a RankFailed)."
        _ON_EVERY_RANK[cls] = type(cls.__name__, (RankFailed, cls), {"__doc__": doc, "__module__": __name__})
    return _ON_EVERY_RANK[cls]


# Codes carried in the cross-rank check record, so every rank can raise the class that the
# offending rank raised without sending anything but integers.
ERROR_CODES: dict[int, type[ReshardError]] = {
    1: InvalidArgument,
    2: UnsupportedDType,
    3: MismatchError,
    4: ReshardError,
}


def error_code(exc: ReshardError) -> int:
    for code, cls in sorted(ERROR_CODES.items(), key=lambda kv: -len(kv[1].__mro__)):
        if isinstance(exc, cls):
            return code
    return 4
