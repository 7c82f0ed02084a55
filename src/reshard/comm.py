"""The communicator: which ranks take part, on which engine, and the defaults ops use."""

from __future__ import annotations

import atexit
import gc
import hashlib
import os
import shutil
import weakref
from typing import Any

from . import settings
from .engines.available import ENGINES, default_engine, unusable
from .errors import WORLD, InvalidArgument, MissingDependency, RankNames
from .execution import handles
from .execution.buffers import release_buffers
from .execution.replay_cache import ReplayCache
from .execution.tracebacks import public_call

DEFAULT_TIMEOUT: float = settings.BY_NAME["RESHARD_TIMEOUT"].default


_HEAP_SETTLED = False


def _settle_heap() -> None:
    """The objects alive when a process makes its first communicator (its imports: torch's are
    some 10^5) moved out of the cycle collector's reach (``gc.freeze``, a few microseconds).
    Without it the first full collection after torch's import walks them all (0.1 s here), and
    it falls in whatever allocates next: in a job that calls at once, its first collective.
    Reference counting still frees those objects; only cycles among them are no longer found."""
    global _HEAP_SETTLED
    if not _HEAP_SETTLED:
        _HEAP_SETTLED = True
        gc.freeze()


class Comm:
    """A group of ranks and the engine that moves bytes between them.

    ``rank``, ``size``, ``engine`` ("gloo", "nccl" or "mpi"), ``group`` (the torch
    ProcessGroup on torch engines), ``mpi_comm`` (the mpi4py communicator on MPI), ``check``
    (whether ops run the cross-rank agreement check by default), ``timeout`` (seconds).
    ``primitives`` is the engine object whose primitives move the bytes (``reshard.engines.base.Engine``);
    ``engine`` is its name.
    ``hosts[q]`` is rank q's host index (hosts numbered by their lowest rank) and ``host`` this
    rank's: the launcher's grouping where it gives one (torchrun's ``GROUP_RANK``, the MPI
    processor name under a launcher), else the machine itself (its boot and namespaces, the key
    shared memory is offered by). Learned in one small all-gather when the communicator is made
    (every rank makes it together); a sub-communicator takes its members' from its parent.
    """

    def __init__(self, primitives: Any, *, check: bool = True, timeout: float = DEFAULT_TIMEOUT,
                 hosts: list[int] | None = None):
        self.primitives = primitives
        self.rank: int = primitives.rank
        self.size: int = primitives.size
        self.engine: str = primitives.name
        self.check: bool = check
        self.timeout: float = timeout
        self.replay_cache = ReplayCache()  # call signature -> what its first call worked out (call.py)
        self.activity: Any = None  # an activity.Activity where rs.spawn watches this rank
        self.children: list[Comm] = []  # communicators made from this one (mesh dims), closed with it
        self.hosts: list[int] = _numbered(hosts) if hosts is not None else _learn_hosts(primitives)
        self.hosts_mesh: Any = None  # rs.Mesh.from_hosts(self), made by the first two-level exchange
        self.pipeline_lane: Comm | None = None  # rs.moe.pipeline's communicator for its combines
        self.closed = False  # close() ran: its engine's resources are gone, and a call on it is refused
        self.pid = os.getpid()  # a forked child shares its engine's sockets and memory: it may not call on it
        # how messages name its ranks: the world's numbers, with a mesh dim's own beside (Mesh.sub)
        self.rank_names: RankNames = getattr(primitives, "rank_names", WORLD)
        _LIVE.add(self)
        _settle_heap()
        if check and self.engine == "mpi":
            # The vote's board now, while every rank makes the communicator (gloo's is made with its
            # shared memory): a rank that never votes, or leaves, is then named from the first call.
            primitives.vote_board()

    @property
    def host(self) -> int:
        """This rank's host index (see ``hosts``)."""
        return self.hosts[self.rank]

    @property
    def group(self) -> Any:
        return getattr(self.primitives, "group", None)

    @property
    def mpi_comm(self) -> Any:
        return getattr(self.primitives, "mpi_comm", None)

    def barrier(self) -> None:
        if (refused := self.refusal("barrier")) is not None:
            raise refused
        handles.settle()
        if self.activity is not None:
            self.activity.enter("barrier")
        self.primitives.barrier()
        if self.activity is not None:
            self.activity.leave()

    def refusal(self, what: str = "a call") -> InvalidArgument | None:
        """Why ``what`` cannot run on this communicator, or None where it can: its ``close()``
        ran (its engine's groups are gone: going on would end in the engine's own error, or a
        crash), or this process was forked from the one that made it (its sockets and shared
        memory are the parent's: a call would talk for it)."""
        if self.pid != os.getpid():
            return InvalidArgument(f"rank {self.rank}: {what} in a process forked from the rank (pid {self.pid}): its "
                                   "communicator is the parent's and cannot be used here; call collectives in the rank "
                                   "itself")
        if self.closed:
            return InvalidArgument(f"rank {self.rank}: {what} on a closed communicator (comm.close() ran): make a new "
                                   "one with rs.init(), or close it after its last call")
        return None

    def close(self) -> None:
        """End this communicator and the ones made from it (a mesh's dims), after the calls
        started on it. A call on it afterwards raises ``InvalidArgument``; results it made stay
        valid; a second ``close()`` does nothing. A communicator belongs to the process that
        made it: in a process forked from it, calls raise ``InvalidArgument`` and ``close()``
        leaves the engine to the parent."""
        global _current
        if self.closed:  # a second close has nothing left to end
            return
        if self.pid != os.getpid():  # a forked child's copy: the engine is the parent's, left as it is
            self.closed = True
            return
        handles.close(self)  # calls started and never waited for finish first (with a warning)
        self.closed = True  # after them: a started call still takes its communicator as it runs
        for child in self.children:
            child.primitives.close()
            child.replay_cache.clear()  # its hot replays too: a call on it takes the path that refuses it
            child.closed = True
        self.children.clear()
        release_buffers()
        self.replay_cache.clear()
        self.primitives.close()
        if _current is self:
            _current = None

    def __repr__(self) -> str:
        return f"Comm(rank={self.rank}, size={self.size}, engine={self.engine!r})"


_current: Comm | None = None


def _numbered(keys: list[int]) -> list[int]:
    """Host keys as indices 0, 1, ... in the order of each host's lowest rank."""
    index: dict[int, int] = {}
    return [index.setdefault(int(k), len(index)) for k in keys]


def _host_key(primitives: Any) -> int:
    """This rank's host, as a number every rank of that host computes alike."""
    group = os.environ.get("GROUP_RANK")  # torchrun: the index of this rank's node
    if group is not None and "TORCHELASTIC_RUN_ID" in os.environ:
        return -1 - int(group)
    if primitives.name == "mpi" and launcher_env() is not None:
        from mpi4py import MPI

        return int.from_bytes(hashlib.blake2b(MPI.Get_processor_name().encode(), digest_size=8).digest(), "little") >> 1
    from .engines.shm import host_key

    return host_key()


def _learn_hosts(primitives: Any) -> list[int]:
    """Collective: every rank's host index, from one all-gather of an int64 per rank."""
    if primitives.size == 1:
        return [0]
    import numpy as np

    mine = np.array([_host_key(primitives)], dtype=np.int64)
    keys = primitives.allgather_bytes(mine.view(np.uint8), "hosts").view(np.int64).reshape(-1)
    return _numbered([int(k) for k in keys])


def current(comm: Comm | None = None, what: str = "a call") -> Comm:
    """``comm`` if given, else the one rs.init() or rs.spawn made in this process (``what``:
    the call, as an error names it)."""
    if comm is not None:
        if not isinstance(comm, Comm):
            raise InvalidArgument(f"comm must be a reshard Comm, got {type(comm).__name__}")
    elif _current is None:
        raise InvalidArgument("no communicator: call rs.init() (under torchrun/mpirun) or run inside rs.spawn")
    else:
        comm = _current
    if (refused := comm.refusal(what)) is not None:
        raise refused
    return comm


def current_or_none() -> Comm | None:
    """The communicator rs.init() or rs.spawn made in this process, or None."""
    return _current


_LIVE: weakref.WeakSet = weakref.WeakSet()  # every communicator of this process


def _forget_replays_in_child() -> None:
    """In a forked child: no hot replay runs on the parent's communicators (a call takes the
    path that refuses it)."""
    for comm in list(_LIVE):
        comm.replay_cache.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_replays_in_child)


def set_current(comm: Comm | None) -> None:
    global _current
    _current = comm


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise InvalidArgument(f"environment variable {name}={raw!r} is not an integer") from None


def launcher_env() -> tuple[str, int, int] | None:
    """(launcher, rank, size) read from torchrun or MPI variables, validated; None if neither."""
    for launcher, rank_var, size_var in (
        ("torchrun", "RANK", "WORLD_SIZE"),
        ("mpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
        ("mpi", "PMI_RANK", "PMI_SIZE"),
        ("mpi", "PMIX_RANK", "PMIX_SIZE"),
    ):
        rank, size = _env_int(rank_var), _env_int(size_var)
        if rank is None and size is None:
            continue
        if rank is None or size is None:
            raise InvalidArgument(f"{rank_var} and {size_var} must be set together (got only one)")
        if size < 1:
            raise InvalidArgument(f"{size_var}={size}: the world size must be at least 1")
        if not 0 <= rank < size:
            raise InvalidArgument(f"{rank_var}={rank} is outside [0, {size_var}={size})")
        return launcher, rank, size
    return None


def _mpi(timeout: float) -> Any:
    from .engines.mpi_engine import init_mpi  # importing mpi4py's MPI may start MPI itself

    return init_mpi(timeout)


def _lone_mpi(timeout: float) -> Any:
    """MPI as a singleton (a process no launcher started). Open MPI makes its session directory
    under TMPDIR and leaves part of it behind, so it gets a private one, removed at exit; and
    its shared-memory transport leaves a segment in /dev/shm, so a process with no peers uses
    only its transport to itself (unless the user chose the transports)."""
    import tempfile

    tmp = tempfile.mkdtemp(prefix="reshard-solo-")
    atexit.register(shutil.rmtree, tmp, True)
    before = {name: os.environ.get(name) for name in ("TMPDIR", "OMPI_MCA_btl")}
    os.environ["TMPDIR"] = tmp
    os.environ.setdefault("OMPI_MCA_btl", "self")
    try:
        return _mpi(timeout)
    finally:
        for name, value in before.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value


@public_call
def init(engine: str | None = None, timeout: float | None = None, check: bool = True) -> Comm:
    """Join the job this process was started in and return its communicator.

    Under torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) it initialises
    torch.distributed (gloo, or NCCL when ``engine="nccl"``); under mpirun/mpiexec it uses
    mpi4py; inside rs.spawn it returns the communicator already made (once that is closed, a
    gloo job's rank cannot join again: ``InvalidArgument``; an MPI job's can). A process started by
    none of them gets a communicator of size 1. ``check=False`` (or RESHARD_CHECK=0) turns off
    the cross-rank agreement check by default. The process's first communicator freezes the
    objects alive then out of the cycle collector (``gc.freeze``: the docs' "First calls").
    """
    if _current is not None:
        return _current
    if engine is not None and engine not in ENGINES:
        raise InvalidArgument(f"engine must be one of {ENGINES} or None, got {engine!r}")
    settings.check_set()
    timeout = settings.check_seconds("timeout", timeout) if timeout is not None else settings.read("RESHARD_TIMEOUT")
    check = check and settings.read("RESHARD_CHECK")
    found = launcher_env()
    spawned = settings.read("RESHARD_WORLD_SIZE")  # a torch rank of rs.spawn, whose communicator was closed
    if found is None and spawned is not None and spawned > 1:
        raise InvalidArgument(f"rank {settings.read('RESHARD_RANK')}: rs.init() after this rs.spawn rank's communicator "
                              f"was closed: the job's {spawned} ranks cannot be joined again (a new communicator would "
                              "hold this rank alone); close it after the job's last call")
    if engine is None and found is None:  # a lone process: gloo where torch is installed, else MPI
        engine = default_engine()[0]
    wanted = engine or ("mpi" if found is not None and found[0] == "mpi" else "gloo")
    missing = unusable(wanted)
    if missing is not None:
        raise MissingDependency(missing)
    if wanted == "mpi":
        primitives = _lone_mpi(timeout) if found is None else _mpi(timeout)
    else:
        from .engines.torch_engine import init_torch

        backend = "nccl" if engine == "nccl" else "gloo"
        if found is None:
            import tempfile

            import torch.distributed as dist

            # A lone process: a size-1 group on a private file store, no listener anywhere.
            tmp = tempfile.mkdtemp(prefix="reshard-solo-")
            atexit.register(shutil.rmtree, tmp, True)
            store = dist.FileStore(os.path.join(tmp, "store"), 1)
            primitives = init_torch(backend, 0, 1, timeout, store=store)
            primitives.scratch_dir = tmp
        else:
            _, rank, size = found
            primitives = init_torch(backend, rank, size, timeout)
    comm = Comm(primitives, check=check, timeout=timeout)
    set_current(comm)
    return comm
