"""``redistribute`` on a process mesh: validate and agree on the mesh's communicator, then run
the ``MeshPlan``: the reductions of Partial sources on their mesh dims' sub-communicators, one
exchange of boxes over the whole mesh (each element a rank needs and does not hold, once),
and the fill of Partial destinations."""

from __future__ import annotations

import zlib
from typing import Any

from . import execute
from .buffers import alloc, pack_buffer
from .call import MISS, Call, wants_grad
from .errors import InvalidArgument, MismatchError
from .layout import Partial, Replicate, Shard, check_int, mesh_region, normalize_dim, parse_placements
from .mesh import Mesh
from .mesh_plan import Box, MeshPlan, box_size
from .plan import make_plan

Array = Any


def _code(placements: tuple) -> int:
    """The placements as one integer for the agreement record (any mesh size)."""
    return zlib.crc32(repr(placements).encode()) & 0x7FFFFFFF


def redistribute_mesh(x: Array, src: Any, dst: Any, mesh: Mesh, global_shape: Any, check: bool | None,
                      rule: str = "balanced") -> Array:
    """``x`` (this rank's part under ``src``) as its part under ``dst``, on ``mesh``; shards
    split by ``rule`` (``balanced``, or ``chunk`` as PyTorch DTensor splits)."""
    call = Call("redistribute", x, mesh.comm, check, ("src", "dst", "mesh"))
    replayed = call.replay((tuple(parse_placements(src)), tuple(parse_placements(dst)), global_shape, mesh.shape, rule))
    if replayed is not MISS:
        return replayed
    s_pl = d_pl = ()
    gshape = None
    with call.validating():
        s_pl, d_pl = parse_placements(src), parse_placements(dst)
        if len(s_pl) != mesh.ndim or len(d_pl) != mesh.ndim:
            raise InvalidArgument(f"src {list(s_pl)} and dst {list(d_pl)} need one placement per mesh dim ({mesh.ndim})")
        needs_dims = any(isinstance(p, Shard) for p in (*s_pl, *d_pl))
        call.take_input(need_dims=needs_dims)
        nd = call.x.ndim
        s_pl = tuple(Shard(normalize_dim(p.dim, nd, "src Shard dim")) if isinstance(p, Shard) else p for p in s_pl)
        d_pl = tuple(Shard(normalize_dim(p.dim, nd, "dst Shard dim")) if isinstance(p, Shard) else p for p in d_pl)
        call.record.args = (_code(s_pl), _code(d_pl), _code((mesh.shape, rule)))
        for m, (a, b) in enumerate(zip(s_pl, d_pl)):  # in the order the world's redistribute checks
            if isinstance(a, Partial) and a != b:
                execute.check_reducible(call.arrays, call.x, a.op)
            if isinstance(b, Partial) and a != b:  # the result must reduce with b's op
                execute.check_reducible(call.arrays, call.x, b.op)
            if isinstance(b, Partial) and b.op == "avg" and isinstance(a, Shard):
                raise InvalidArgument(f"mesh dim {m}: Shard -> Partial('avg') cannot be exact; use Partial('sum')")
        if global_shape is not None:
            gshape = tuple(check_int(f"global_shape[{i}]", g) for i, g in enumerate(global_shape))
            call.record.global_shape = gshape
            want = tuple(b - a for a, b in mesh_region(gshape, s_pl, mesh.coord, mesh.shape, rule)) if len(gshape) == nd else None
            if want != tuple(call.x.shape):
                raise InvalidArgument(f"x has shape {list(call.x.shape)}, but {list(s_pl)} of global_shape {list(gshape)} "
                                      f"on mesh {list(mesh.shape)} gives the rank at {list(mesh.coord)} the shape "
                                      f"{list(want) if want else '(a different number of dims)'}")
    free = tuple(sorted({p.dim for p in s_pl if isinstance(p, Shard)}))
    shapes = call.agree(free_dims=free, need_shapes=gshape is None)
    if gshape is None:
        gshape = _global_shape(shapes, s_pl, mesh, rule)
    if s_pl == d_pl:
        call.numpy_in = False
        return call.result(x)
    plan = MeshPlan(gshape, s_pl, d_pl, mesh.shape, rule)
    run, ahead = mesh_run(call, mesh, plan)
    out = run(call, call.x)

    def grad(k: Call, x: Array, out: Array) -> Array:
        from . import autograd

        back = [autograd.backward_placements(a, b) for a, b in zip(s_pl, d_pl)]
        back_src, back_dst = tuple(b[0] for b in back), tuple(b[1] for b in back)

        def reverse(g: Array) -> Array:
            if back_src == back_dst:
                return g
            return redistribute_mesh(g, back_src, back_dst, mesh, gshape, False, rule)

        return autograd.attach(x, out, reverse)

    if wants_grad(x):
        out = grad(call, x, out)
    call.remember(run, grad, ahead)
    return call.result(out)


def _global_shape(shapes: list, src: tuple, mesh: Mesh, rule: str) -> tuple[int, ...]:
    """The global shape from every rank's local shape, checked against the balanced rule."""
    from .mesh import unravel

    ndim = len(shapes[0])
    gshape = list(shapes[0])
    for d in range(ndim):
        dims = [m for m, p in enumerate(src) if isinstance(p, Shard) and p.dim == d]
        if not dims:
            continue
        total = 0
        for r, shape in enumerate(shapes):  # the ranks at coordinate 0 on every other mesh dim
            coord = unravel(r, mesh.shape)
            if all(coord[m] == 0 for m in range(mesh.ndim) if m not in dims):
                total += shape[d]
        gshape[d] = total
    gshape = tuple(gshape)
    for r, shape in enumerate(shapes):
        want = tuple(b - a for a, b in mesh_region(gshape, src, unravel(r, mesh.shape), mesh.shape, rule))
        if tuple(shape) != want:
            raise MismatchError(
                f"redistribute: {list(src)} on mesh {list(mesh.shape)} of the global shape {list(gshape)} gives the "
                f"rank {r} the shape {list(want)}, but it holds {list(shape)}: shards must follow the balanced rule"
            )
    return gshape


def _slices(box: Box, origin: Box) -> tuple[slice, ...]:
    return tuple(slice(a - o, b - o) for (a, b), (o, _) in zip(box, origin))


def mesh_run(call: Call, mesh: Mesh, plan: MeshPlan) -> Any:
    """``run(call, x, sent=None)`` for this rank's part of ``plan``, everything worked out once,
    and ``ahead(call, x)`` (its local work, done early; its result is ``sent``) or None."""
    rank = mesh.comm.rank
    subs = {red.mesh_dim: mesh.sub(red.mesh_dim) for red in plan.reductions}  # every rank, same order
    sends, received = plan.rank_exchange(rank)
    moves = plan.moves()
    recvs = sorted(((p, i, box) for i, (p, box) in enumerate(received)), key=lambda t: (t[0], t[1]))
    held, target = plan.exchange.held(rank), plan.target(rank)
    kept = plan.kept(rank)
    out_shape = tuple(b - a for a, b in target)
    send_counts: dict[int, int] = {}  # elements per peer: only this rank's peers, never a list of every rank
    for q, box in sends:
        send_counts[q] = send_counts.get(q, 0) + box_size(box)
    recv_counts: dict[int, int] = {}
    for p, _, box in recvs:
        recv_counts[p] = recv_counts.get(p, 0) + box_size(box)

    exchange = _BoxExchange(held, target, sends, recvs, send_counts, recv_counts)
    all_reduces: dict = {}  # reduction -> its plan on the mesh dim's sub-communicator

    def start(k: Call, xt: Array) -> tuple[Array, Any]:
        out = alloc(k.arrays, k.stats, out_shape, like=xt)
        if plan.fill_op is not None:
            out = k.arrays.full_like(out, k.arrays.identity(xt, plan.fill_op))
        return out, (lambda: [k.arrays.copy(out[_slices(box, target)], xt[_slices(box, held)]) for box in kept])

    def ahead(k: Call, xt: Array) -> Any:
        """The local work (the result, this rank's own part, every packed piece) done before
        the exchange, e.g. while the replay's check travels."""
        out, keep = start(k, xt)
        keep()
        return out, exchange.pack(k, xt)

    def run(k: Call, xt: Array, sent: Any = None) -> Array:
        stats = k.stats
        for red in plan.reductions:
            kk = Call(f"redistribute ({red.collective} on mesh dim {red.mesh_dim})", xt, subs[red.mesh_dim], False)
            kk.take_input()
            started = stats.begin_step()
            if red.collective == "reduce_scatter":
                xt = execute.reduce_scatter_core(kk, kk.x, red.dim, red.op)
            else:  # planned on the first run, replayed after (the shape there never changes)
                if red not in all_reduces:
                    all_reduces[red] = make_plan(tuple(xt.shape), Partial(red.op), Replicate(), kk.size,
                                                 itemsize=k.arrays.itemsize(xt))
                xt = execute.plan_run(kk, kk.x, all_reduces[red])(kk, kk.x)
            for name in ("bytes_sent", "bytes_received", "allocated_bytes", "pack_copies", "unpack_copies"):
                setattr(stats, name, getattr(stats, name) + getattr(kk.stats, name))
            stats.end_step(red.collective, started)
        if sent is not None:
            (out, packed), keep = sent, None
        else:
            (out, keep), packed = start(k, xt), None
        if moves:
            started = stats.begin_step()
            exchange.run(k, xt, out, packed, keep)
            stats.end_step("all_to_all", started)
        elif keep is not None:
            keep()
        return out

    # Only a change with no reduction first can do its local work before the exchange.
    return run, (None if plan.reductions else ahead)


class _BoxExchange:
    """One message per peer and direction. A peer's piece that is one contiguous run of the
    result is received straight into it, one that is a run of the input is sent as it is; the
    rest goes through a buffer (packed before its send, unpacked once it arrived)."""

    def __init__(self, held: Box, target: Box, sends: list, recvs: list, send_counts: dict[int, int],
                 recv_counts: dict[int, int]) -> None:
        self.held, self.target = held, target
        self.send_counts, self.recv_counts = send_counts, recv_counts
        self.by_src: dict[int, list[Box]] = {}
        for p, _, box in recvs:
            self.by_src.setdefault(p, []).append(box)
        self.by_dst: dict[int, list[Box]] = {}
        for q, box in sends:
            self.by_dst.setdefault(q, []).append(box)

    def pack(self, k: Call, xt: Array) -> list[tuple[int, Array]]:
        return list(self._messages(k, xt))

    def _messages(self, k: Call, xt: Array) -> Any:
        """Each peer's piece, packed (where it is not a run of the input) into its own part of one buffer."""
        arrays, stats = k.arrays, k.stats
        as_is = {}
        for q, boxes in self.by_dst.items():
            view = xt[_slices(boxes[0], self.held)] if len(boxes) == 1 else None
            if view is not None and arrays.is_contiguous(view):
                as_is[q] = view.reshape(-1)
        pack, base = None, 0
        if len(as_is) < len(self.by_dst):  # the pack buffer first, before any message leaves
            pack = pack_buffer(k, sum(self.send_counts.values()), like=xt)
            stats.pack_copies += 1
        for q, boxes in sorted(self.by_dst.items()):
            if q in as_is:
                yield q, as_is[q]
                continue
            at = base
            for box in boxes:
                n = box_size(box)
                arrays.copy(pack[at : at + n].reshape(tuple(b - a for a, b in box)), xt[_slices(box, self.held)])
                at += n
            yield q, pack[base:at]
            base = at

    def run(self, k: Call, xt: Array, out: Array, packed: list | None, meanwhile: Any) -> None:
        """Receive into ``out``, send ``packed`` (or pack now, after the receives are posted);
        ``meanwhile()``, if given, runs once every send is under way (the rank's own part)."""
        arrays, stats = k.arrays, k.stats
        landing, unpack = [], []
        for p, boxes in sorted(self.by_src.items()):
            view = out[_slices(boxes[0], self.target)] if len(boxes) == 1 else None
            if view is not None and arrays.is_contiguous(view):
                landing.append((p, view.reshape(-1)))
            else:
                side = alloc(arrays, stats, [self.recv_counts[p]], like=xt)
                landing.append((p, side))
                unpack.append((side, boxes))

        def messages() -> Any:
            yield from packed if packed is not None else self._messages(k, xt)
            if meanwhile is not None:
                meanwhile()

        k.transport.exchange_pairs([(p, arrays.bytes_of(b)) for p, b in landing],
                                   ((q, arrays.bytes_of(b)) for q, b in messages()), k.op, stats)
        for side, boxes in unpack:
            at = 0
            for box in boxes:
                n = box_size(box)
                arrays.copy(out[_slices(box, self.target)], side[at : at + n].reshape(tuple(b - a for a, b in box)))
                at += n
        if unpack:
            stats.unpack_copies += 1
        item = arrays.itemsize(xt)
        stats.bytes_sent += sum(self.send_counts.values()) * item
        stats.bytes_received += sum(self.recv_counts.values()) * item


def redistribute_dtensor(x: Any, dst: Any, check: bool | None) -> Any:
    """A DTensor in, a DTensor out: the change runs on the DTensor's device mesh, with its local
    tensor split as DTensor splits (torch.chunk's rule), and the result wrapped again."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor import Partial as TorchPartial
    from torch.distributed.tensor import Replicate as TorchReplicate
    from torch.distributed.tensor import Shard as TorchShard

    device_mesh = x.device_mesh
    mesh = _MESHES.get(id(device_mesh))
    if mesh is None or mesh[0] is not device_mesh:
        mesh = (device_mesh, Mesh.from_torch(device_mesh))
        _MESHES[id(device_mesh)] = mesh
    src = parse_placements(x.placements)
    d_pl = parse_placements(dst)
    out = redistribute_mesh(x.to_local(), src, d_pl, mesh[1], tuple(x.shape), check, rule="chunk")
    placements = [TorchShard(p.dim) if isinstance(p, Shard) else TorchPartial(p.op) if isinstance(p, Partial)
                  else TorchReplicate() for p in d_pl]
    return DTensor.from_local(out, device_mesh, placements, run_check=False, shape=x.shape, stride=x.stride())


_MESHES: dict[int, tuple] = {}  # device mesh -> its reshard mesh (sub-communicators made once)
