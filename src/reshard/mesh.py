"""Process meshes: the ranks of a communicator laid out as an N-D grid.

Rank r sits at ``np.unravel_index(r, shape)`` (row-major). ``mesh.sub(dim)`` is a communicator
over the ranks that share every coordinate but ``dim``'s, on the same engine, on which every
collective runs as on any other communicator. A 1-D mesh is the plain world.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .comm import Comm, current
from .errors import InvalidArgument, RankNames
from .execution import handles
from .execution.tracebacks import public_call
from .planning.layout import check_int, ravel, unravel
from .validate import hosts_mesh_shape

__all__ = ["Mesh", "ravel", "unravel"]


class Mesh:
    """An N-D grid of the ranks of ``comm``: ``shape``, ``names`` (one per dim), ``coord`` (this
    rank's), ``size``; ``sub(dim)`` gives the communicator along one dim."""

    @public_call
    def __init__(self, shape: Sequence[int], names: Sequence[str] | None = None, comm: Comm | None = None):
        self.comm = current(comm, "rs.Mesh")
        try:
            self.shape = tuple(check_int(f"shape[{i}]", s) for i, s in enumerate(shape))
        except TypeError:
            raise InvalidArgument(f"a mesh shape is a sequence of ints, got {shape!r}") from None
        if not self.shape or any(s < 1 for s in self.shape):
            raise InvalidArgument(f"mesh shape {list(self.shape)} needs at least one dim, each at least 1")
        size = 1
        for s in self.shape:
            size *= s
        if size != self.comm.size:
            raise InvalidArgument(f"a mesh of shape {list(self.shape)} has {size} ranks, but the communicator has {self.comm.size}")
        self.size = size
        self.names = _names(names, len(self.shape))
        if len(self.names) != len(self.shape) or len(set(self.names)) != len(self.names):
            raise InvalidArgument(f"names {list(self.names)} must name each of the {len(self.shape)} mesh dims once")
        self.coord = unravel(self.comm.rank, self.shape)
        self._subs: dict[int, Comm] = {}

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def dim_index(self, dim: int | str) -> int:
        if isinstance(dim, str):
            if dim not in self.names:
                raise InvalidArgument(f"the mesh has no dim named {dim!r} (its dims: {list(self.names)})")
            return self.names.index(dim)
        d = check_int("dim", dim)
        if not -self.ndim <= d < self.ndim:
            raise InvalidArgument(f"mesh dim {d} is out of range for a {self.ndim}-d mesh")
        return d % self.ndim

    def group_of(self, dim: int | str, coord: Sequence[int] | None = None) -> list[int]:
        """The ranks that share every coordinate of ``coord`` (default this rank's) but ``dim``'s."""
        m = self.dim_index(dim)
        base = list(self.coord if coord is None else coord)
        members = []
        for k in range(self.shape[m]):
            base[m] = k
            members.append(ravel(base, self.shape))
        return members

    @public_call
    def sub(self, dim: int | str) -> Comm:
        """Collective on the first call for a dim (every rank calls it): the communicator over
        the ranks that share every other coordinate, ranked by their coordinate along ``dim``."""
        m = self.dim_index(dim)
        if m not in self._subs:
            handles.settle()  # a collective: after the calls started before it
            groups, seen = [], set()
            for r in range(self.size):
                members = self.group_of(m, unravel(r, self.shape))
                if members[0] not in seen:
                    seen.add(members[0])
                    groups.append(members)
            primitives = self.comm.primitives.subgroup(groups)
            members = next(g for g in groups if self.comm.rank in g)
            parent = self.comm.rank_names
            primitives.name_ranks(RankNames([parent.world_rank(q) for q in members], self.names[m]))
            sub = Comm(primitives, check=self.comm.check, timeout=self.comm.timeout,
                       hosts=[self.comm.hosts[q] for q in members])
            sub.activity = self.comm.activity
            self.comm.children.append(sub)
            self._subs[m] = sub
        return self._subs[m]

    @classmethod
    def from_hosts(cls, comm: Comm | None = None) -> Mesh:
        """The mesh ``(hosts, ranks per host)`` of ``comm`` (dims named "host" and "local"):
        ranks on one host share a row, so ``sub("local")`` holds the peers that may share
        memory and ``sub("host")`` the ranks with the same local index on every host."""
        comm = current(comm)
        return cls(hosts_mesh_shape(comm.hosts), names=("host", "local"), comm=comm)

    @classmethod
    def from_torch(cls, device_mesh: Any, comm: Comm | None = None) -> Mesh:
        """The reshard mesh of a ``torch.distributed.device_mesh.DeviceMesh`` over the default
        group: the same shape and dim names, ranks laid out as torch lays them out."""
        shape = tuple(int(s) for s in device_mesh.mesh.shape)
        names = getattr(device_mesh, "mesh_dim_names", None)
        mesh = cls(shape, names=names, comm=comm)
        layout = [int(r) for r in device_mesh.mesh.reshape(-1).tolist()]
        if layout != list(range(mesh.size)):
            raise InvalidArgument(f"the device mesh lays ranks out as {layout}; reshard meshes are row-major 0..N-1")
        return mesh

    def __repr__(self) -> str:
        return f"Mesh(shape={self.shape}, names={self.names}, coord={self.coord})"


def _names(names: Any, ndim: int) -> tuple[str, ...]:
    """The mesh dims' names (``dim0``, ``dim1``... where none are given; a string alone names
    a 1-D mesh's dim), checked to be strings."""
    if names is None:
        return tuple(f"dim{i}" for i in range(ndim))
    if isinstance(names, str):  # one name: a 1-D mesh's (as JAX's Mesh reads it)
        names = (names,)
    try:
        named = tuple(names)
    except TypeError:
        named = None
    if named is None or not all(isinstance(v, str) for v in named):
        hint = " (pass the communicator as comm=)" if isinstance(names, Comm) else ""
        raise InvalidArgument(f"a mesh's names are one string per mesh dim, got {names!r}{hint}")
    return named
