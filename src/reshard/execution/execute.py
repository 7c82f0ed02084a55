"""The executor: one loop that runs a plan's typed steps on this rank through the engine.

``PlanRun(call, x, plan)`` works out, once per call signature, how each step of the rank's
``RankPlan`` runs (the engine's own form of an all-to-all: NCCL all_to_all_single, MPI
Alltoallw with subarray datatypes, gloo pairs or shared memory; the bodies in ``step_bodies``
for the rest), and calling it runs them in order, each recorded as one ``ExecutedStep`` in the
call's stats (the only writer of those). A replay calls the same object again; every
public collective's data moves through here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..engines import arena as arena_mod
from ..engines.base import CallState, Tally
from ..planning import planner
from ..planning.steps import (
    AllGather,
    AllToAll,
    AllToAllV,
    ExchangeBoxes,
    Gather,
    OnMeshDim,
    RankPlan,
    ReduceScatter,
    Reorder,
    Step,
    with_dim,
)
from . import arena_reads, phases, step_bodies
from .arrays import numel, numpy_view
from .call import Call, wants_grad
from .stats import ExchangeStats, ExecutedStep, last_exchange, set_last

Array = Any  # torch.Tensor or numpy.ndarray
Runner = Callable[..., Array]  # (call, x, prepared=None) -> the step's output
SubComm = Callable[[int], Any]  # mesh dim -> the communicator along it
_FORMED = (AllToAll, ExchangeBoxes, OnMeshDim, AllGather, ReduceScatter)  # steps whose form is made from their input


class PlanRun:
    """``plan`` made runnable on this rank: ``run(call, x, prepared=None)`` returns the result;
    ``prepared`` (what ``prepare`` or the engine's ``prepare_send`` returned) goes to the
    first step. ``sub(m)`` gives the communicator along mesh dim ``m`` (mesh plans only)."""

    def __init__(self, call: CallState, x: Array, plan: RankPlan, sub: SubComm | None = None, record: bool = True,
                 mesh_shape: Any = None):
        self.plan = plan
        self.record = record
        walked = planner.walk(plan, tuple(x.shape), mesh_shape)
        # each step's form made for its own input: the call's x first, then what the step
        # before made (a new C-order array of the shape the plan gives)
        self.runners = [(step.collective, _runner(call, x if i == 0 or not isinstance(step, _FORMED)
                                                  else call.arrays.empty(shape, like=x), step, sub))
                        for i, (step, shape, _, _) in enumerate(walked)]
        # What every run of a step does, recorded here rather than by its form: the bytes it
        # sends and receives (from the plan: an OnMeshDim step's inner plan counts its own),
        # the form's own counters, and whether it receives into its result
        item = call.arrays.itemsize(x)
        traffic = [(step.collective, sent, received) for step, _, sent, received in walked]
        moved = [(0, 0) if isinstance(step, OnMeshDim) else (sum(sent.values()) * item, sum(received.values()) * item)
                 for step, (_, sent, received) in zip(plan.steps, traffic)]
        self.declared = [((("bytes_sent", out), ("bytes_received", into), *getattr(run, "counts", ())),
                          getattr(run, "receives_result", False)) for (_, run), (out, into) in zip(self.runners, moved)]
        self.bare = tuple(run for _, run in self.runners)
        # the result is what the last step received into (a hot replay notes it without a Call)
        self.receives_result = bool(self.declared) and self.declared[-1][1]
        self.cross_host = (0, 0)  # (bytes, messages) to other hosts, from the plan: the same every run
        hosts = getattr(getattr(call, "comm", None), "hosts", None)
        if record and hosts is not None and len(set(hosts)) > 1 and len(hosts) == plan.size:
            elements, messages = planner.cross_host_traffic(traffic, plan.rank, hosts)
            self.cross_host = (elements * item, messages)

    def __call__(self, k: CallState, xt: Array, prepared: Any = None, record: bool = True) -> Array:
        """The result of the plan's steps on ``xt``. ``record=False``: a hot replay, whose stats
        are those of the replay that made it (the plan decides them): nothing is recorded."""
        if not record:
            for runner in self.bare:
                xt = runner(k, xt, prepared)
                prepared = None
            return xt
        stats, tally = k.stats, k.tally
        steps = self.record  # an inner plan's steps are its caller's one step
        for (name, runner), (counts, receives) in zip(self.runners, self.declared):
            started = stats.begin_step() if steps else None
            xt = runner(k, xt, prepared)
            prepared = None
            if receives:
                tally.landing = xt
            for field, value in counts:
                setattr(stats, field, getattr(stats, field) + value)
            if steps:
                stats.end_step(name, started)
        if steps and self.cross_host[1]:
            stats.cross_host_bytes_sent += self.cross_host[0]
            stats.cross_host_messages += self.cross_host[1]
        if steps:  # an inner plan's tally and checks are its caller's
            _take_tally(stats, tally)
            _settle(stats, k)
        return xt

    @property
    def prepare(self) -> Callable[[CallState, Array], Any] | None:
        """``prepare(call, x)``: the first step's local work (the result with this rank's own
        part in it, every packed piece), done early, e.g. while the replay's vote travels; None
        where the first step has none to do early."""
        first = self.runners[0][1] if self.runners else None
        return first.prepare if isinstance(first, step_bodies.BoxRun) else None


def _take_tally(stats: ExchangeStats, tally: Tally) -> None:
    """What the forms noted in ``tally`` (copies, memory, where they received) recorded in
    ``stats``; the tally starts again."""
    stats.pack_copies += tally.packs + tally.staged
    stats._staged += tally.staged
    stats.unpack_copies += tally.unpacks
    stats.allocated_bytes += tally.allocated
    into = tally.landing
    if into is not None:
        if type(into) is int:
            stats.received_at(into)
        else:
            stats.received_into_result(into)
    tally.packs = tally.unpacks = tally.allocated = tally.staged = 0
    tally.landing = None


def _settle(stats: ExchangeStats, call: Any) -> None:
    """What the call itself did, in its stats: its checks (metadata exchanges) and whether it
    ran the program of an earlier call with its signature."""
    stats.metadata_exchanges = call.checks
    stats.replayed = call.replaying


def finish(call: Call, out: Array) -> Array:
    """The end of a call that runs no program (nothing to move): its stats settled, its result."""
    _settle(call.stats, call)
    return call.result(out)


def report_as(op: str, call: Any, packs: int = 0, unpacks: int = 0) -> None:
    """``rs.last_exchange()`` for an op made of one exchange inside its own call (MoE): the
    exchange's stats named ``op``, with the op's own checks (its records, the counts), the
    ``packs`` it made before the exchange and the ``unpacks`` after it added."""
    stats = last_exchange().copy()
    stats.op = op
    stats.metadata_exchanges += call.checks
    stats.pack_copies += packs
    stats.unpack_copies += unpacks
    set_last(stats)


def merged(op: str, parts: list[tuple[str, ExchangeStats | None]], packs: int = 0) -> ExchangeStats:
    """One ``ExchangeStats`` for an op made of several exchanges, each one step of it, as
    ``rs.last_exchange()`` from now on; ``packs``: the copies the op packed outside them."""
    total = ExchangeStats(op)
    total.pack_copies = packs
    for name, part in parts:
        if part is None:
            continue
        for key in ("pack_copies", "unpack_copies", "bytes_sent", "bytes_received", "metadata_exchanges",
                    "allocated_bytes", "cross_host_bytes_sent", "cross_host_messages"):
            setattr(total, key, getattr(total, key) + getattr(part, key))
        total.steps.append(ExecutedStep(name, part.bytes_sent, part.bytes_received))
    set_last(total)
    return total


def _runner(call: CallState, x: Array, step: Step, sub: SubComm | None) -> Runner:
    """How one step runs on this rank (dispatch on the step's type: a closed set)."""
    if isinstance(step, AllToAll):
        link = arena_reads.link_for(call.primitives, _all_to_all_elements(step), call.arrays.itemsize(x)) \
            if arena_reads.allowed(x) else None
        form = call.primitives.all_to_all_form(call, x, step)
        return form if link is None else arena_reads.all_to_all_reads(link, call.rank, step, form)
    if isinstance(step, (AllGather, ReduceScatter)) and arena_reads.allowed(x):
        reads = _gather_or_scatter_reads(call, x, step)
        if reads is not None:
            return reads
    if isinstance(step, AllToAllV):
        link = arena_reads.link_for(call.primitives, step.total_rows * numel(x.shape[1:]), call.arrays.itemsize(x)) \
            if step.total_rows and arena_reads.allowed(x) else None
        rows = lambda k, xt, prepared=None: step_bodies.exchange_rows(k, xt, step.segments)  # noqa: E731
        if link is None:  # the rows gathered first where the caller left them to the exchange
            return lambda k, xt, prepared=None: rows(k, arena_reads.taken_rows(k, xt))
        return arena_reads.RowsReads(link, call.rank, step.segments, rows)
    if isinstance(step, AllGather) and step.dim is not None:
        return lambda k, xt, prepared=None: step_bodies.gather_core(k, xt, step.dim, step.lengths, None)
    if isinstance(step, AllGather):  # runs of the flattened tensor, as all_reduce gathers them
        return lambda k, xt, prepared=None: step_bodies.gather_core(k, xt, 0, step.lengths, None).reshape(step.shape)
    if isinstance(step, Gather):
        return lambda k, xt, prepared=None: step_bodies.gather_core(k, xt, step.dim, step.lengths, step.root)
    if isinstance(step, ReduceScatter):
        if step.dim is None:
            return lambda k, xt, prepared=None: step_bodies.reduce_scatter_core(k, xt.reshape(-1), 0, step.op)
        return lambda k, xt, prepared=None: step_bodies.reduce_scatter_core(k, xt, step.dim, step.op)
    if isinstance(step, Reorder):
        return lambda k, xt, prepared=None: step_bodies.reorder(k, xt, step)
    if isinstance(step, ExchangeBoxes):  # on the engine's own collective where it has one for boxes
        form = getattr(call.primitives, "boxes_form", None)
        boxes = step_bodies.BoxRun(step, form(call, x, step) if form is not None and step.moves else None)
        link = arena_reads.link_for(call.primitives, numel(step.shape), call.arrays.itemsize(x)) \
            if step.moves and step.shape and arena_reads.allowed(x) else None
        return boxes if link is None else arena_reads.boxes_reads(link, step, boxes)
    if isinstance(step, OnMeshDim):
        return _on_mesh_dim(call, x, step, sub)
    raise TypeError(f"not a step: {step!r}")


def _gather_or_scatter_reads(call: CallState, x: Array, step: AllGather | ReduceScatter) -> Runner | None:
    """all_gather, or the exchange of reduce_scatter (its reduction after it, in rank order),
    as reads in place where the group has a link and the tensor is large enough; else None."""
    flat = step.dim is None
    shape = (numel(x.shape),) if flat else tuple(x.shape)
    dim = 0 if flat else step.dim
    item = call.arrays.itemsize(x)
    if isinstance(step, AllGather):
        link = arena_reads.link_for(call.primitives, numel(with_dim(shape, dim, sum(step.lengths))), item)
        if link is None:
            return None
        gather = lambda k, xt, prepared=None: step_bodies.gather_core(k, xt, dim, step.lengths, None)  # noqa: E731
        reads = arena_reads.gather_reads(link, call.rank, shape, dim, step.lengths, gather)
        if not flat:
            return reads
        return lambda k, xt, prepared=None: reads(k, xt.reshape(-1)).reshape(step.shape)
    link = arena_reads.link_for(call.primitives, numel(shape) * call.size, item)
    if link is None:
        return None
    def reduce(k: CallState, stacked: Array) -> Array:  # in rank order, as the engine's path does
        k.tally.allocated += numel(stacked.shape[1:]) * k.arrays.itemsize(stacked)  # the accumulator
        return k.arrays.stack_reduce(stacked, step.op)

    whole = lambda k, xt, prepared=None: step_bodies.reduce_scatter_core(k, xt, dim, step.op)  # noqa: E731
    reads = arena_reads.scatter_reads(link, call.rank, call.size, shape, dim, whole, reduce)
    return lambda k, xt, prepared=None: reads(k, xt.reshape(-1) if flat else xt)


def _all_to_all_elements(g: AllToAll) -> int:
    """The elements of every rank's input together (the same number on every rank: the dims
    other than ``concat_dim`` agree, and ``recv_lengths`` lists every rank's extent along it);
    0 where the split and concatenated dims are one (each rank's extent is its own)."""
    c = g.concat_dim
    if g.split_dim == c:
        return 0
    return numel(with_dim(g.in_shape, c, 1)) * sum(g.recv_lengths)


class _OnComm:
    """The state a step's forms read (``CallState``), on a mesh dim's communicator: the
    calling rank's op and arrays, its stats and tally while it runs (set by each run)."""

    def __init__(self, call: Any, comm: Any, op: str):
        self.op, self.primitives = op, comm.primitives
        self.rank, self.size = comm.rank, comm.size
        self.arrays, self.stats, self.tally = call.arrays, getattr(call, "stats", None), call.tally


def _on_mesh_dim(call: CallState, x: Array, step: OnMeshDim, sub: SubComm | None) -> Runner:
    """The step's own steps on the mesh dim's communicator, compiled here with the rest of the
    program and counted in the calling run's stats."""
    if sub is None:
        raise TypeError(f"{step!r} needs the mesh's communicators")
    on = _OnComm(call, sub(step.mesh_dim), f"{call.op} ({step.name} on mesh dim {step.mesh_dim})")
    inner = PlanRun(on, x, RankPlan(on.op, on.rank, on.size, step.steps), record=False)

    def run(k: CallState, xt: Array, prepared: Any = None) -> Array:
        on.stats, on.tally, on.arrays = k.stats, k.tally, k.arrays
        return inner(on, xt)

    return run


def prepare_send(call: CallState, x: Array, split_dim: int, send_sizes: Any) -> Any:
    """The engine's pack of an all-to-all's input, as a job to run early (while the check's
    records travel), where its form packs before the exchange; None where it does not, or where
    the input lies in the shared arena (its peers will likely read it in place)."""
    if arena_reads.allowed(x) and arena_mod.locate(numpy_view(x)) is not None:
        return None
    return call.primitives.prepare_send(call, x, split_dim, send_sizes)


def run(call: Call, x: Array, plan: RankPlan, backward: Any = None, sub: Any = None, mesh_shape: Any = None) -> Array:
    """The end of every public collective: run ``plan`` on this rank (the call's prepared work
    to its first step), put the result on the autograd tape with its backward (``backward()``
    gives the plan back, or a function of the gradient), keep the run for the next call with
    the same signature, and return the result."""
    run = PlanRun(call, call.x, plan, sub, mesh_shape=mesh_shape)
    with phases.phase(call.op):
        out = run(call, call.x, call.prepared)
    grad = None
    if backward is not None:
        grad = _grad(call.comm, backward, sub, mesh_shape)
        if wants_grad(x):
            out = grad(call, x, out)
    call.remember(run, grad, run.prepare)
    return call.result(out)


def _grad(comm: Any, backward: Any, sub: Any, mesh_shape: Any = None) -> Any:
    """``grad(call, x, out)``: ``out`` on the autograd tape, its backward the plan back."""
    def grad(k: Call, x: Array, out: Array) -> Array:
        from . import autograd

        back = backward()
        if callable(back):
            return autograd.attach(x, out, back)
        runs: list = []

        def reverse(g: Array) -> Array:  # the forward was checked: the way back needs no check
            kk = Call(back.op, g, comm, False)
            kk.take_input()
            if not runs:
                runs.append(PlanRun(kk, kk.x, back, sub, mesh_shape=mesh_shape))
            return kk.result(runs[0](kk, kk.x))

        return autograd.attach(x, out, reverse)

    return grad
