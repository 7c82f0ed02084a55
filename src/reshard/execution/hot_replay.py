"""Hot replays: a training loop's repeated unchecked call, run again at once.

An unchecked replay that needs nothing from its peers (``call``) leaves a ``HotReplay`` on its
communicator's replay cache, the last four per op. A later call of that op whose arguments
equal its ones by value and by kind, on an input of the same type, dtype, shape and strides,
runs the plan's step runners straight away: no signature is built, no plan looked up, and the
stats are the replay's own (the plan decides them), made when ``rs.last_exchange()`` reads
them. Anything else is a ``MISS`` and takes the full path.

A checked replay leaves one too (kept apart: ``ReplayCache.hot_checked``). Its call casts the
vote a ``Call`` would cast for that plan (``ballot``), doing the plan's local work while the
vote travels, and runs the plan once every rank voted the same. Where they did not, the votes
are left on the communicator for the ``Call`` that takes over (``ReplayCache.votes``), so that
no rank votes twice.
"""

from __future__ import annotations

import operator
import weakref
from typing import Any

import numpy as np

from ..comm import Comm, current_or_none
from ..planning.layout import Layout, Partial, Replicate, Shard, Spec
from . import handles
from .activity import op_code
from .arrays import is_numpy, is_torch, resolved, to_torch
from .stats import ExchangeStats, Tally, set_last_replay

MISS = object()  # no result: the call goes on down the full path
_weak_ref = weakref.ref  # bound once: a hot replay takes one per call


def plain_key(value: Any) -> Any:
    """``value`` as a key part: plain ints, strings, placements, None and tuples/lists of them
    (bools tagged, so True and 1 differ; numpy's integers as the int they stand for);
    TypeError for anything else (no replay then). Runs on every replay: kept cheap."""
    kind = type(value)
    if kind is int or kind is str or value is None:
        return value
    if kind is tuple or kind is list:
        return (kind, tuple([v if type(v) is int else plain_key(v) for v in value]))
    if kind is Shard and type(value.dim) is int:  # placements by their fields: cheap to hash
        return (Shard, value.dim)
    if kind is Partial:
        return (Partial, value.op)
    if kind is Replicate or kind is bool:
        return (kind, value)
    if kind is Layout:  # placements with split orders
        return (Layout, tuple([plain_key(p) for p in value]), value.order)
    if kind is Spec:
        return (Spec, value.entries, value.partial)
    if hasattr(kind, "__index__") and kind.__name__ != "bool_":
        return operator.index(value)  # numpy's integers: the int they stand for
    raise TypeError(kind)


def _landing(tally: Tally) -> Any:
    """Where a hot replay's program received, as ``set_last_replay`` takes it (an address, or
    a weak reference to the array it received into); the tally starts again (a hot replay
    keeps no counts: its stats are those of the call that made it)."""
    into = tally.landing
    tally.packs = tally.unpacks = tally.allocated = 0
    tally.landing = None
    if into is None or type(into) is int:
        return into or 0
    return weakref.ref(into)


def _as_run(stats: ExchangeStats, tally: Tally) -> ExchangeStats:
    """The stats of the call that made a hot replay, with this run's copies into the shared
    arena where they differ (``ExchangeStats.with_staged``)."""
    staged, tally.staged = tally.staged, 0
    return stats if staged == stats._staged else stats.with_staged(staged)


class ReplayState:
    """What a replayed plan's steps read of their call (``engines.base.CallState``), and no more."""

    __slots__ = ("op", "rank", "size", "arrays", "primitives", "stats", "tally", "checks", "replaying")

    def __init__(self, op: str, comm: Comm, arrays: Any):
        self.op, self.rank, self.size, self.arrays, self.primitives = op, comm.rank, comm.size, arrays, comm.primitives
        self.stats, self.tally = ExchangeStats(op), Tally()  # the stats filled by the executor
        self.checks, self.replaying = 0, True


def replay_hot(op: str, x: Any, comm: Comm | None, check: bool | None, args: tuple) -> Any:
    """The result of one of this op's last unchecked replays run again, where ``args`` and
    ``x`` are those it was made for (``HotReplay``), or ``MISS``: a few attribute reads and
    comparisons before the engine's call."""
    x = resolved(x)  # a lazy conjugate moves its values
    if comm is None:
        comm = current_or_none()
        if comm is None:
            return MISS
    elif type(comm) is not Comm:
        return MISS  # the full path names the problem
    if handles.pending():
        return MISS
    cache = comm.replay_cache
    if cache.votes is not None:  # cast by a call that raised before its Call took them: stale
        cache.votes = None
    kept = (cache.hot_checked if (comm.check if check is None else check) else cache.hot).get(op)
    if kept is None:
        return MISS
    for hot in kept:  # newest first; a loop alternating a few signatures finds each here
        out = hot.run(comm, args, x)
        if out is not MISS or comm.replay_cache.votes is not None:  # a rank votes once a call
            return out
    return MISS


def _array_key(x: Any, numpy_in: bool) -> tuple:
    """What of ``x`` a plan depends on (as ``_signature`` has it), cheaply; ``numpy_in``: the
    array becomes a tensor, which a read-only one cannot become without a copy."""
    if type(x) is np.ndarray:
        return (np.ndarray, x.dtype, x.shape, x.strides, x.flags.writeable if numpy_in else None)
    return (type(x), x.dtype, x.device, x.shape, x.is_contiguous(), x.requires_grad)


def _kind(arg: Any) -> Any:
    """The type of ``arg`` and of the items of a sequence: what ``==`` does not see
    (``True == 1``, ``4.0 == 4``), where the full path refuses a bool or a float."""
    return (type(arg), *map(type, arg)) if type(arg) in (tuple, list) else type(arg)


def _may_hide_a_kind(arg: Any) -> bool:
    """Whether ``==`` may call ``arg`` equal to a value of another kind: numbers, and
    sequences (their items, or a sequence of another type holding equal ones)."""
    return not (arg is None or type(arg) is str or type(arg) in (Shard, Partial, Replicate))


def _args_match(kept: tuple, kind_checks: tuple, args: tuple) -> bool:
    """Whether ``args`` equal the ``kept`` ones by value (one comparison in C, which passes the
    very objects kept at once), then by kind where ``==`` may hide one (``kind_checks``: the
    positions and kinds) and the object is not the one kept (lists are kept as copies)."""
    try:
        if kept != args:
            return False
    except Exception:  # an argument whose == cannot say (an array): the full path judges it
        return False
    for i, kind in kind_checks:
        if args[i] is not kept[i] and _kind(args[i]) != kind:
            return False
    return True


def _owned(value: Any) -> Any:
    """``value`` as a hot replay keeps it to compare with later calls' arguments: lists copied
    (a caller may change theirs in place), objects that compare by identity (a mesh) as they
    are; TypeError for what a plan's key cannot hold (``plain_key``)."""
    kind = type(value)
    if kind is list:
        return [_owned(v) for v in value]
    if kind is tuple:
        owned = tuple([_owned(v) for v in value])
        return value if all(a is b for a, b in zip(owned, value)) else owned
    if kind.__eq__ is not object.__eq__:
        plain_key(value)
    return value


class HotReplay:
    """An unchecked replay reduced to what runs it: the arguments (by value and kind) and the
    input it was made for, the executor's program of the plan (run with nothing recorded), a
    state for its steps, and the stats that every such replay ends with (the same each time:
    the plan decides them)."""

    __slots__ = ("op_code", "args", "kind_checks", "x_key", "program", "state", "stats", "numpy_in",
                 "ballot", "vote", "vote_what", "prepare", "run")

    @classmethod
    def of(cls, op: str, args: tuple, x: Any, comm: Comm, plan: Any, stats: ExchangeStats,
           ballot: int | None = None) -> HotReplay | None:
        """The hot form of ``plan``'s replay, or None where ``args`` or ``x`` cannot key one.
        ``ballot``: a checked replay's vote for the plan (the op's code above its digest)."""
        if not hasattr(plan.run, "runners") or not (is_numpy(x) or is_torch(x)) or (is_torch(x) and x.requires_grad):
            return None
        try:
            args = _owned(args)
        except TypeError:
            return None
        hot = cls()
        hot.args, hot.x_key = args, _array_key(x, plan.numpy_in)
        # where == alone may pass an argument of another kind: its position and its kind
        hot.kind_checks = tuple([(i, _kind(a)) for i, a in enumerate(args) if _may_hide_a_kind(a)])
        hot.op_code, hot.program = op_code(op), plan.run  # the executor's program, as every call runs it
        hot.state, hot.numpy_in = ReplayState(op, comm, plan.arrays), plan.numpy_in
        hot.stats = stats.copy()  # apart from the one a caller may hold
        hot.ballot, hot.vote, hot.vote_what, hot.prepare = ballot, None, f"{op} (check)", None
        if ballot is not None:  # the vote as a Call casts it (the ballot and its negation), made once
            hot.vote, hot.prepare = np.array([ballot, -ballot], dtype=np.int64), plan.prepare
        hot.run = hot.numpy_form() or hot.__call__
        return hot

    def numpy_form(self) -> Any:
        """The common replay, a numpy array in and out, unchecked, as one closure over what it
        compares (``run``): each attribute read and call saved shows beside a 64 KiB exchange.
        Anything it does not expect goes to ``__call__``."""
        if self.vote is not None or self.x_key[0] is not np.ndarray or self.numpy_in:
            return None
        _, dtype, shape, strides, _ = self.x_key
        kept, kind_checks, program, state, stats, code = self.args, self.kind_checks, self.program, self.state, self.stats, self.op_code
        general, ndarray, tally, receives = self.__call__, np.ndarray, state.tally, self.program.receives_result

        def run(comm: Comm, args: tuple, x: Any) -> Any:
            if type(x) is not ndarray or x.dtype is not dtype or x.shape != shape or x.strides != strides:
                return general(comm, args, x)
            try:  # _args_match written out: a call fewer
                if kept != args:
                    return MISS
            except Exception:
                return MISS
            for i, kind in kind_checks:
                if args[i] is not kept[i] and _kind(args[i]) != kind:
                    return MISS
            activity = comm.activity
            if activity is not None:
                activity.enter_code(code)
            out = program(state, x, None, False)
            if activity is not None:
                activity.leave()
            into = _landing(tally)
            set_last_replay(_as_run(stats, tally), _weak_ref(out) if receives else into)
            return out

        return run

    def __call__(self, comm: Comm, args: tuple, x: Any) -> Any:
        """The replay's result, or ``MISS`` where ``args`` or ``x`` differ from those it was made for."""
        x_key, numpy_in = self.x_key, self.numpy_in
        if type(x) is not x_key[0]:
            return MISS
        if not _args_match(self.args, self.kind_checks, args):
            return MISS
        if x_key[0] is np.ndarray and not numpy_in:  # the common case, compared field by field
            dtype = x_key[1]
            if x.shape != x_key[2] or x.strides != x_key[3] or x.dtype is not dtype and x.dtype != dtype:
                return MISS
        elif x_key != _array_key(x, numpy_in):
            return MISS
        activity = comm.activity
        if activity is not None:
            activity.enter_code(self.op_code)
        xt = to_torch(x) if numpy_in else x
        prepared = None
        if self.vote is not None:  # checked: every rank must vote for this plan
            finish = comm.primitives.start_allreduce_max(self.vote, self.vote_what)
            if self.prepare is not None:
                prepared = self.prepare(self.state, xt)
            votes = finish()
            mine = self.ballot
            if int(votes[0]) != mine or -int(votes[1]) != mine:  # not every rank holds this plan
                comm.replay_cache.votes = (self.state.op, votes)  # for the Call that takes over
                if activity is not None:
                    activity.leave()
                return MISS
        state, program = self.state, self.program
        out = program(state, xt, prepared, False)
        into = _landing(state.tally)
        set_last_replay(_as_run(self.stats, state.tally), _weak_ref(out) if program.receives_result else into)
        if activity is not None:
            activity.leave()
        return out.numpy() if numpy_in and out is not None else out
