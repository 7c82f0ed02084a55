"""One collective call on one rank: input conversion, validation, the cross-rank agreement
check, and the replay of an earlier call's plan.

Training loops call the same op on the same shapes every step. The first call of a signature
(op, arguments, input shape, dtype, device, contiguity, check) validates, checks and works out
the exchange (piece shapes, datatypes, counts); later calls replay that plan.

With the check on, every call first takes a *vote*: one all-reduce (max) of two int64 per
rank, carrying the op's code and the digest of the records its plan was made from (0 where it
has no plan or cannot replay). Ranks in different collectives learn it there, on every rank. A plan runs only when every rank holds one made from the same records, which, since a
rank's own record is part of its signature, means the records are unchanged on every rank; any
other outcome sends every rank down the full path, which exchanges the records themselves. The
vote is 16 bytes whatever the number of ranks, where the records are O(ranks) bytes each. With
the check off, a replay that needs its peers' shapes exchanges its record and compares the
records byte for byte instead; any change falls back to the full path with them in hand.
"""

from __future__ import annotations

import functools
import hashlib
import sys
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from ..comm import Comm, current, current_or_none
from ..errors import InvalidArgument, MismatchError, ReshardError
from . import agreement, handles, phases
from .arrays import array_backend, check_array, dtype_name, is_numpy, is_torch, resolved, to_torch
from .hot_replay import MISS, HotReplay, ReplayState, plain_key, replay_hot
from .stats import ExchangeStats, Tally, set_last

Array = Any  # torch.Tensor or numpy.ndarray

T = TypeVar("T")
_DIGEST_BITS = 47  # a vote: the op's 16-bit code, then the digest of the plan's records
_DIGEST_MASK = (1 << _DIGEST_BITS) - 1
_TEXT_BYTES = 160  # one tensor's value, as each rank shows it in a disagreement


@dataclass
class CachedRun:
    """What a successful call worked out, kept for the next call with its signature."""

    digest: int  # a 47-bit digest of every rank's records when the plan was made (0: made without
    # them, so a replay needs nothing from its peers), this rank's vote on a replay
    run: Callable[..., Array]  # (call, x) -> result
    arrays: Any
    numpy_in: bool
    detach: bool
    grad: Callable[..., Array] | None  # (call, x, out) -> out on the autograd tape
    prepare: Callable[..., Any] | None = None  # (call, x) -> the run's ``prepared``: local work done early


def _op_code(op: str) -> int:
    return zlib.crc32(op.encode()) & 0xFFFF


def _op_bytes(op: str) -> np.ndarray:
    raw = op.encode()[:64]
    return np.frombuffer(raw + b"\0" * (64 - len(raw)), dtype=np.uint8).copy()  # writable: torch warns on a read-only one


def _signature(op: str, x: Any, check: bool, args: tuple) -> tuple | None:
    """What decides a call's plan on this rank (requires_grad last), or None (never replayed)."""
    try:
        plain = tuple([v if type(v) is int else plain_key(v) for v in args])
        if is_numpy(x):
            return (op, plain, check, type(x), x.dtype, x.shape, x.strides, x.flags.writeable, False)
        if is_torch(x):
            return (op, plain, check, type(x), x.dtype, x.device, tuple(x.shape), x.is_contiguous(), x.requires_grad)
    except (TypeError, RuntimeError):
        pass
    return None


def run_started(op: str, run: Callable[[], Any], comm: Comm | None, x: Any = None, lane: Comm | None = None
                ) -> handles.Handle:
    """``run()``, the blocking call, started (``async_op=True``): its ``Handle``. ``comm`` (None:
    the current one) is checked now, so a call with no communicator raises at once. ``lane``: a
    communicator of reshard's own that no other started call uses, whose calls then run on a
    worker of their own (``handles.submit``)."""
    if type(x).__name__ == "DTensor":  # on its own device mesh
        import torch.distributed as dist

        return handles.submit(op, dist.get_rank(), run, None)
    comm = current(None if _stands_in(comm) else comm, op)  # a stand-in: the started call's Call names it
    return handles.submit(op, comm.rank, run, comm, lane)


def _stands_in(comm: Any) -> bool:
    """Whether ``comm`` is given but is no communicator while the process has one: the call
    then runs its check on the process's, holding the error, so that its peers there raise too."""
    return comm is not None and not isinstance(comm, Comm) and current_or_none() is not None


def replay_or_new(op: str, x: Any, comm: Comm | None, check: bool | None, args: tuple,
          arg_names: Sequence[str] = (), hot_args: tuple | None = None) -> tuple[Any, Call | None]:
    """A collective's start on this rank: ``(result, None)`` where the plan of an earlier call
    with this signature ran (a replay), else ``(MISS, call)``, the ``Call`` that goes on down
    the full path. An unchecked replay that needs nothing from its peers, a training loop's
    repeated call, runs without building a ``Call`` at all. ``hot_args`` (default ``args``)
    are the arguments as the caller got them, for ``replay_hot``; a caller that passes them
    has tried ``replay_hot`` itself."""
    x = resolved(x)  # a lazy conjugate moves its values, on every path below
    if hot_args is None:
        hot_args = args
        done = replay_hot(op, x, comm, check, args)
        if done is not MISS:
            return done, None
    done = _replay_alone(op, x, comm, check, args, hot_args)
    if done is not MISS:
        return done, None
    call = Call(op, x, comm, check, arg_names)
    done = call.replay(args, hot_args)
    return (MISS, call) if done is MISS else (done, None)


def refuse(op: str, x: Any, comm: Comm | None, check: bool | None, error: ReshardError,
           arg_names: Sequence[str] = ()) -> None:
    """Raise ``error``, found before the call knew its communicator from its arguments (a mesh
    that is not one, or none where the placements need one), on every rank: this rank takes its part in the agreement on ``comm`` (or
    the process's), as the others do on theirs, holding the error, so that they raise too
    instead of waiting for it. Where there is no communicator at all, raises it here alone."""
    try:
        comm = current(comm)
    except ReshardError:
        raise error from None
    call = Call(op, x, comm, check, arg_names)
    call.validate(_raise, error, need_dims=False)
    call.agree(need_shapes=False)
    raise error  # the agreement raised already; kept for readers and type checkers


def _raise(x: Any, error: ReshardError) -> None:
    raise error


def _replay_alone(op: str, x: Any, comm: Comm | None, check: bool | None, args: tuple, hot_args: tuple) -> Any:
    """The replay of a plan that exchanges nothing before it runs (check off, every shape
    known when it was made, no autograd), or ``MISS``: what ``Call.replay`` would do for such
    a plan, without the ``Call``. It leaves a ``HotReplay`` for the next call with ``hot_args``."""
    if handles.pending():  # after the calls started before this one
        handles.settle()
    if _stands_in(comm):
        return MISS  # the Call names it, on every rank
    comm = current(comm, op)
    if comm.check if check is None else check:  # the vote: a Call's work
        return MISS
    key = _signature(op, x, False, args)
    plan = None if key is None else comm.replay_cache.get(key)
    if plan is None or plan.digest or plan.detach:
        return MISS
    activity = comm.activity
    if activity is not None:
        activity.enter(op)
    state = ReplayState(op, comm, plan.arrays)
    out = plan.run(state, to_torch(x) if plan.numpy_in else x)
    set_last(state.stats)
    if activity is not None:
        activity.leave()
    hot = HotReplay.of(op, hot_args, x, comm, plan, state.stats)
    if hot is not None:
        comm.replay_cache.keep_hot(op, hot)
    return out.numpy() if plan.numpy_in and out is not None else out


class Call:
    """One collective call on one rank: input conversion, validation, the agreement check."""

    def __init__(self, op: str, x: Any, comm: Comm | None, check: bool | None, arg_names: Sequence[str] = (),
                 input_name: str = "x"):
        handles.settle()  # a blocking call runs after the calls started before it
        self.op = op
        self.input_name = input_name  # the input as the op's signature names it, in messages
        refused = None
        if _stands_in(comm):
            refused = InvalidArgument(f"rank {current().rank}: {op}: comm must be a reshard Comm, got {type(comm).__name__}")
            comm = None
        self.comm = current(comm, op)
        if self.comm.activity is not None:
            self.comm.activity.enter(op)
        self.check = self.comm.check if check is None else bool(check)
        self.primitives = self.comm.primitives
        self.arrays = self.primitives.arrays
        self.rank, self.size = self.comm.rank, self.comm.size
        self.numpy_in = False
        self.x = resolved(x)  # a lazy conjugate moves its values, not its memory
        self.arg_names = arg_names
        self.error: ReshardError | None = None
        self.stats = ExchangeStats(op)  # filled by the executor
        self.tally = Tally()  # what the forms note as they run
        self.checks = 0  # metadata exchanges this call made: its vote, records, counts
        self.replaying = False  # it runs the program of an earlier call with its signature
        self.prepared: Any = None  # what the first step prepared while the records travelled
        self.key: tuple | None = None  # the call's signature, when it can be replayed
        self.gathered_raw: bytes | None = None
        self.replay_exchanges = True
        self.extra_gathered: Any = None
        self.voted = False  # this call took the vote already (its replay did)
        if refused is not None:
            self.error = refused
            self.record.fail(refused)
        self.arg_text: dict[str, Callable[[int], str]] = {}  # an argument's code as the user wrote it
        # a call on many tensors: per argument, (what it is of one tensor, each tensor's text), so
        # that a disagreement names the first tensor that differs and every rank's value of it
        self.per_tensor: dict[str, tuple[str, list[str]]] = {}
        self.arg_texts: dict[str, str] = {}  # an argument as this rank shows it, where its record holds a checksum

    @functools.cached_property
    def record(self) -> agreement.Record:
        """What this rank was asked to do, for the agreement (made only on the full path)."""
        return agreement.Record(op=self.op, arg_names=tuple(self.arg_names))

    def replay(self, args: tuple, hot_args: tuple | None = None) -> Any:
        """This call's result from the plan of an earlier call with the same signature, or
        ``MISS`` (then nothing was sent and the full path takes over). With the check on, the
        plan runs only when the vote finds every rank holding a plan made from the same
        records; the plan's local work (``prepare``) is done while the vote travels, and a
        ``HotReplay`` is left for the next call with ``hot_args``. Where a checked hot replay
        of this op voted already, its votes are counted instead."""
        key = _signature(self.op, self.x, self.check, args)
        self.key = key
        plan = None if key is None or self.error is not None else self.comm.replay_cache.get(key)
        if plan is not None and not plan.digest and self.check:
            plan = None  # made without the records: it cannot vote
        x, arrays, prepared = self.x, self.arrays, None
        if plan is not None:
            self.arrays = plan.arrays
            if plan.numpy_in:
                x = to_torch(x)
            elif plan.detach:
                x = x.detach()
        vote = None
        voted = self.comm.replay_cache.take_votes(self.op) if self.check else None
        if voted is not None:
            if not self._count(voted):
                plan = None
        elif self.check:
            # Every rank votes, plan or not, so the collectives line up whatever each found.
            vote = self._ballot(plan.digest if plan else 0)
            if plan is not None and plan.prepare is not None:
                finish = self.primitives.start_allreduce_max(vote, f"{self.op} (check)")
                prepared = plan.prepare(self, x)
                replay = self._count(finish())
            else:  # nothing to do meanwhile: no hand-off to a helper thread
                replay = self._count(self.primitives.allreduce_max(vote, f"{self.op} (check)"))
            if not replay:
                plan = None
        elif plan is not None and plan.digest:
            # check off, the peers' shapes needed: the vote, as with the check on (every rank's
            # plan made from the same records), not the records themselves; a rank without a
            # plan votes on its full path (``_agree``), so the collectives line up
            if not self._count(self.primitives.allreduce_max(self._ballot(plan.digest), f"{self.op} (check)")):
                plan = None
        if plan is None:
            self.arrays = arrays
            self.tally = Tally()  # the full path counts from scratch (not what a prepare noted)
            return MISS
        self.numpy_in = plan.numpy_in
        self.replaying = True
        out = plan.run(self, x) if prepared is None else plan.run(self, x, prepared)
        if plan.grad is not None and wants_grad(self.x):
            out = plan.grad(self, self.x, out)
        elif vote is not None and hot_args is not None and not plan.detach:
            hot = HotReplay.of(self.op, hot_args, self.x, self.comm, plan, self.stats, ballot=int(vote[0]))
            if hot is not None:
                self.comm.replay_cache.keep_hot(self.op, hot, checked=True)
        return self.result(out)

    def _ballot(self, digest: int) -> np.ndarray:
        """This rank's vote: the op's code above the plan's digest (0: no plan), and its negation
        (the all-reduce's max of both gives every rank the largest and the smallest vote)."""
        mine = (_op_code(self.op) << _DIGEST_BITS) | digest
        return np.array([mine, -mine], dtype=np.int64)

    def _count(self, votes: np.ndarray) -> bool:
        """True when every rank voted for the same plan; raises on every rank when they are in
        different collectives (the op codes differ)."""
        self.voted = True
        self.checks += 1
        high, low = int(votes[0]), -int(votes[1])
        if high >> _DIGEST_BITS != low >> _DIGEST_BITS:
            ops = self.primitives.allgather_bytes(_op_bytes(self.op), f"{self.op} (check)")
            called = [bytes(row).rstrip(b"\0").decode("utf-8", "replace") for row in ops]
            raise MismatchError(f"{self.comm.rank_names.one(self.rank)}: ranks called different collectives: "
                                + agreement.by_rank(called, names=self.comm.rank_names))
        return high == low and high & _DIGEST_MASK != 0

    def remember(self, run: Callable[..., Array], grad: Callable[..., Array] | None = None,
                 prepare: Callable[..., Any] | None = None) -> None:
        """Keep what this (successful) call worked out, for the next call with its signature;
        ``prepare(call, x)``, if given, is ``run``'s local work, whose result ``run`` takes as ``prepared``."""
        if self.key is None:
            return
        x = self.x
        detach = is_torch(x) and self.key[-1]  # requires_grad
        # A replay votes only when the check is on or the peers' shapes are needed.
        gathered = self.gathered_raw if self.replay_exchanges else None
        digest = 0
        if gathered is not None:
            digest = int.from_bytes(hashlib.blake2b(gathered, digest_size=8).digest(), "little") & _DIGEST_MASK or 1
        cached = CachedRun(digest, run, self.arrays, self.numpy_in, bool(detach), grad, prepare)
        self.comm.replay_cache.put_for(self.op, self.key, cached, len(self.gathered_raw or b""))

    def validate(self, check: Callable[..., T], *args: Any, need_dims: bool = True) -> T | None:
        """This rank's input taken (``take_input``) and ``check(x, *args)`` (a pure function of
        ``validate``) run on it: the checked arguments, or None with the error held for the
        agreement, which raises it on every rank before any rank computes on."""
        try:
            self.take_input(need_dims)
            return check(self.x, *args)
        except ReshardError as exc:
            msg, me = str(exc), self.comm.rank_names.one(self.rank)
            if not msg.startswith(f"{me}: ") and not msg.startswith(f"rank {self.rank}: "):
                exc.args = (f"{me}: {self.op}: {msg}",) + exc.args[1:]
            self.error = exc
            self.record.fail(exc)
            return None

    def take_input(self, need_dims: bool = True) -> None:
        x = self.x
        check_array(x, self.input_name, need_dims)
        self.record.dtype = dtype_name(x)
        self.record.shape = tuple(int(s) for s in x.shape)
        if is_numpy(x) and self.arrays.name == "torch":
            self.numpy_in = True
            x = to_torch(x)
        elif is_torch(x):
            self.arrays = array_backend("torch")  # torch CPU tensors on MPI: the engine sees them as buffers
        if is_torch(x):
            self.record.device = x.device.type
            if x.device.type != "cpu" and self.comm.engine in ("gloo", "mpi"):
                raise InvalidArgument(
                    f"{self.input_name} is on {x.device}, but this communicator's engine ({self.comm.engine}) moves "
                    "CPU tensors only"
                )
            if x.device.type == "cpu" and self.comm.engine == "nccl":
                raise InvalidArgument(f"{self.input_name} is on the CPU, but this communicator's engine (nccl) moves "
                                      "CUDA tensors only")
            if x.requires_grad:
                x = x.detach()
        else:
            self.record.device = "cpu"
        self.x = x

    def agree(
        self, free_dims: Sequence[int] = (), need_shapes: bool = True, per_rank_splits: bool = False,
        prepare: Any = None, extra: Any = None, vote: bool = False,
    ) -> list[tuple[int, ...]]:
        """Exchange every rank's record and compare them; raise on any problem, on every rank.

        The first call of a signature always agrees, whatever ``check`` says: ``check=False``
        only lets a *replay* skip the exchange (where no shapes are needed), so a disagreement
        ends in an error, never in wrong data. Returns every rank's input shape.
        ``prepare()`` (local work, e.g. the pack) runs while the records are in flight, unless
        this rank's input was already found invalid; its result is ``self.prepared``.
        ``extra`` (int64 values, the same count on every rank) travels in the same exchange;
        every rank's row of it lands in ``self.extra_gathered``. ``vote``: vote even where
        neither the check nor the shapes ask for it, for a caller whose ``need_shapes`` comes
        from inputs that may differ across ranks (a list's tensors), so that the collectives
        line up until the records show the difference.
        """
        if phases.on():
            with phases.phase("check"):
                return self._agree(free_dims, need_shapes or vote, per_rank_splits, prepare, extra, need_shapes)
        return self._agree(free_dims, need_shapes or vote, per_rank_splits, prepare, extra, need_shapes)

    def _agree(self, free_dims: Sequence[int], votes: bool, per_rank_splits: bool, prepare: Any,
               extra: Any, need_shapes: bool) -> list[tuple[int, ...]]:
        if not self.voted and (self.check or votes):
            # a call that cannot replay still votes wherever a peer's replay would (check on, or
            # its peers' shapes needed): the ops line up
            self._count(self.primitives.allreduce_max(self._ballot(0), f"{self.op} (check)"))
        raw = agreement.encode(self.record, self.size)
        if extra is not None:
            raw = np.concatenate([raw, np.ascontiguousarray(extra, dtype=np.int64).view(np.uint8)])
        finish = self.primitives.start_allgather_bytes(raw, f"{self.op} (check)")
        self.checks += 1
        if prepare is not None and self.error is None:
            self.prepared = prepare()  # local work (the pack) while the records travel
        gathered = finish()
        self.replay_exchanges = self.check or need_shapes
        self.gathered_raw = gathered.tobytes()
        width = len(raw) - (0 if extra is None else len(extra) * 8)
        if extra is not None:
            self.extra_gathered = np.ascontiguousarray(gathered[:, width:]).view(np.int64)
        records = [agreement.decode(row[:width], self.size, self.record.arg_names) for row in gathered]
        if self.error is None and self.record.error_code:  # e.g. too many dims, found by encode
            self.error = agreement.ERROR_CODES[self.record.error_code](self.record.message)
        agreement.raise_errors(records, self.rank, self.error, self.comm.rank_names)
        try:
            agreement.compare(records, free_dims, per_rank_splits, self.arg_text, self.comm.rank_names)
        except MismatchError as exc:
            argument = getattr(exc, "argument", None)
            named = self._where_lists_part(records, exc) if argument == "input" else self._said_in_full(argument)
            if named is not None:
                raise named from None
            raise exc from None
        self.records = records
        return [r.shape for r in records]

    def _where_lists_part(self, records: Sequence[agreement.Record], exc: MismatchError) -> MismatchError | None:
        """Where ranks passed lists of different lengths: the first position where they part, with
        every rank's tensor there (dtype and local shape) or the end of its list. The position is
        the first whose dtype or number of dims differs, else the first whose shape differs (a
        sharded dim's length may differ by design), else the end of the shortest list. One small
        exchange of two checksums per tensor, on the failure path; every rank holds the same
        records, so all of them take it, or none (a rank given one tensor)."""
        counts = [r.tensors for r in records]
        if min(counts) < 0 or "input" not in self.per_tensor:
            return None
        kinds, shapes = self.per_tensor["input"]
        width, shortest = max(counts), min(counts)
        kinds_at, shapes_at = self._gathered_checksums([kinds, shapes], width)
        at = min(_first_differing(kinds_at, width), shortest)
        if at == shortest:
            at = min(_first_differing(shapes_at, width), shortest)
        mine = f"{kinds[at]} {shapes[at]}" if at < len(kinds) else f"none (its list ends at {len(kinds)} tensors)"
        values = self._gathered_text(mine)
        return MismatchError(f"{exc}; the lists part at tensor {at}: "
                             + agreement.by_rank(values, names=self.comm.rank_names))

    def _said_in_full(self, argument: str | None) -> MismatchError | None:
        """Where the records disagree on ``argument`` and hold only its checksum: every rank's
        text of it (``arg_texts``), or, where it is one text per tensor (``per_tensor``; the
        records agree on the tensor count before any argument is compared), the first tensor
        whose text differs and every rank's text of that. Small exchanges on the failure path;
        every rank holds the same records, so all of them take the same ones. None where there
        is nothing more to say."""
        if argument in self.arg_texts:
            values = self._gathered_text(self.arg_texts[argument])
            return MismatchError(f"{self.op}: " + agreement.describe_disagreement(argument, values,
                                                                                  names=self.comm.rank_names))
        if argument not in self.per_tensor:
            return None
        what, texts = self.per_tensor[argument]
        (per_rank,) = self._gathered_checksums([texts], len(texts))
        i = _first_differing(per_rank, len(texts))
        if i >= len(texts):
            return None
        values = self._gathered_text(texts[i])
        return MismatchError(f"{self.op}: tensor {i}: " + agreement.describe_disagreement(what, values,
                                                                                           names=self.comm.rank_names))

    def _gathered_checksums(self, columns: Sequence[Sequence[str]], width: int) -> list[np.ndarray]:
        """Every rank's checksum of each text of each of ``columns`` (lists of texts, one per
        tensor), in one exchange: per column an int64 [ranks, width] array, -1 past a rank's
        list. ``width`` is the same on every rank."""
        width = max(width, 1)
        codes = np.full(len(columns) * width, -1, dtype=np.int64)
        for c, texts in enumerate(columns):
            codes[c * width : c * width + len(texts)] = [zlib.crc32(t.encode()) for t in texts]
        gathered = self.primitives.allgather_bytes(codes.view(np.uint8), f"{self.op} (check)")
        self.checks += 1
        per_rank = np.ascontiguousarray(gathered).view(np.int64)
        return [per_rank[:, c * width : (c + 1) * width] for c in range(len(columns))]

    def _gathered_text(self, text: str) -> list[str]:
        """Every rank's ``text`` (its first ``_TEXT_BYTES`` bytes), in rank order."""
        mine = text.encode()[:_TEXT_BYTES].ljust(_TEXT_BYTES, b"\0")
        rows = self.primitives.allgather_bytes(np.frombuffer(mine, dtype=np.uint8).copy(), f"{self.op} (check)")
        self.checks += 1
        return [bytes(row).rstrip(b"\0").decode("utf-8", "replace") for row in rows]

    def result(self, out: Array) -> Array:
        set_last(self.stats)
        if self.comm.activity is not None:
            self.comm.activity.leave()
        if self.numpy_in and out is not None:
            return out.numpy()
        return out


def _first_differing(per_rank: np.ndarray, width: int) -> int:
    """The first column where the ranks' rows differ, else ``width``."""
    differ = np.flatnonzero((per_rank != per_rank[0]).any(axis=0))
    return int(differ[0]) if differ.size else width


def wants_grad(x: Any) -> bool:
    """A torch tensor on the autograd tape: the result gets a backward (the reverse exchange)."""
    return is_torch(x) and x.requires_grad and sys.modules["torch"].is_grad_enabled()

