"""``redistribute``: one implementation for a world (the mesh ``(N,)``) and an N-D mesh.

Validate (``validate.redistribute``, pure), agree, learn the global shape from the ranks'
shapes where it was not given, plan this rank's steps (``planner.redistribute``) and run them
(``execute.PlanRun``); the backward is the plan of the gradient's change back. A DTensor in is
changed on its own device mesh with DTensor's split rule, and wrapped again.
"""

from __future__ import annotations

import math
from typing import Any

from . import validate
from .comm import Comm
from .errors import InvalidArgument, MismatchError, ReshardError
from .execution import execute
from .execution.call import Call, refuse, replay_or_new, wants_grad
from .execution.hot_replay import MISS, replay_hot
from .mesh import Mesh
from .planning import planner
from .planning.layout import (
    Partial,
    Shard,
    global_shape_of,
    mesh_region,
    orders_of,
    parse_placements,
    unravel,
    with_order,
)
from .planning.spec import layout_text

Array = Any


def hot_args(src: Any, dst: Any, global_shape: Any, mesh: Mesh | None, rule: str = "balanced") -> tuple:
    """The arguments a hot replay of ``redistribute`` is kept by and found by (``replay_hot``)."""
    return (src, dst, global_shape) if mesh is None else (src, dst, global_shape, mesh, rule)


def redistribute(x: Array, src: Any, dst: Any, comm: Comm | None, mesh: Mesh | None, global_shape: Any,
                 check: bool | None, rule: str = "balanced", hot_tried: bool = False) -> Array:
    """``x`` (this rank's part under ``src``) as its part under ``dst``, on ``mesh`` or, with
    ``mesh=None``, on ``comm`` as the mesh ``(N,)`` (one placement each side). ``hot_tried``:
    the caller found no hot replay for these arguments (``replay_hot``) already."""
    world = mesh is None
    hot = hot_args(src, dst, global_shape, mesh, rule)
    if not hot_tried:
        replayed = replay_hot("redistribute", x, comm if world else mesh.comm, check, hot)
        if replayed is not MISS:
            return replayed
    key = hot if world else (_key_placements(src, mesh), _key_placements(dst, mesh), global_shape, mesh.shape, rule)
    replayed, call = replay_or_new("redistribute", x, comm if world else mesh.comm, check, key,
                           ("src", "dst") if world else ("src", "dst", "mesh"), hot)
    if call is None:
        return replayed
    mesh_shape = (call.size,) if world else mesh.shape
    coord = (call.rank,) if world else mesh.coord
    args = call.validate(validate.redistribute, src, dst, mesh_shape, coord, global_shape, rule, world,
                         None if world else mesh.names, need_dims=False)  # a 0-d x is refused where a placement names a dim
    if args is not None:
        call.record.args = args.code(mesh_shape, rule)
        call.record.global_shape = args.global_shape
    free = tuple(sorted({p.dim for p in args.src if isinstance(p, Shard)})) if args else ()
    if args is not None and args.src == args.dst:
        call.agree(free_dims=free, need_shapes=False)
        call.numpy_in = False
        return execute.finish(call, x)  # the caller's own object: nothing moved, nothing copied
    prepare = None
    first = planner.first_send(call.x.shape, args.src, args.dst, mesh_shape, rule) if args is not None else None
    if first is not None:  # the plan starts with the world's all_to_all: its pack, while the records travel
        prepare = execute.prepare_send(call, call.x, *first)
    needs_lengths = args is not None and args.global_shape is None and bool(free)
    shapes = call.agree(free_dims=free, need_shapes=needs_lengths, prepare=prepare)
    gshape = args.global_shape
    if gshape is None:
        gshape = _global_shape(shapes, args.src, mesh_shape, rule, world) if free else tuple(call.x.shape)
    plan = planner.redistribute(gshape, args.src, args.dst, mesh_shape, call.rank, rule)
    sub = (lambda m: call.comm) if world else mesh.sub
    run = execute.PlanRun(call, call.x, plan, sub, mesh_shape=mesh_shape)
    out = run(call, call.x, call.prepared)
    back = [planner.backward_placements(a, b) for a, b in zip(args.src, args.dst)]
    back_src = with_order([b[0] for b in back], orders_of(args.dst))  # the Shards stay: so do their orders
    back_dst = with_order([b[1] for b in back], orders_of(args.src))

    def grad(k: Call, x: Array, out: Array) -> Array:
        from .execution import autograd

        def reverse(g: Array) -> Array:  # the plan of the gradient's change back, unchecked
            if back_src == back_dst:
                return g
            if world:
                return redistribute(g, back_src[0], back_dst[0], k.comm, None, gshape, False, rule)
            return redistribute(g, back_src, back_dst, None, mesh, gshape, False, rule)

        return autograd.attach(x, out, reverse)

    if wants_grad(x):
        out = grad(call, x, out)
    call.remember(run, grad, run.prepare)
    return call.result(out)


def _key_placements(placements: Any, mesh: Mesh) -> Any:
    """What a call is kept by: the placements as parsed (a Spec by the placements it names on
    this mesh), or the argument itself where it cannot be read (validation reports it)."""
    try:
        return parse_placements(placements, len(mesh.shape), mesh.names)
    except ReshardError:
        return ("unreadable", repr(placements))


def _wants(gshape: tuple, src: tuple, mesh_shape: tuple) -> list[tuple[int, ...]]:
    return [tuple(b - a for a, b in mesh_region(gshape, src, unravel(r, mesh_shape), mesh_shape))
            for r in range(mesh_shape[0])]


def _global_shape(shapes: list, src: tuple, mesh_shape: tuple, rule: str, world: bool) -> tuple[int, ...]:
    """The global shape from every rank's local shape, checked against the split rule."""
    gshape, bad = global_shape_of(shapes, src, mesh_shape, rule)
    if bad is not None:
        if world:
            dim = src[0].dim
            lengths = [sh[dim] for sh in shapes]
            raise MismatchError(
                f"redistribute: Shard({dim}) means the balanced split {[w[dim] for w in _wants(gshape, src, mesh_shape)]} "
                f"of length {gshape[dim]}, but the ranks hold {lengths} along dim {dim}; use all_to_all with "
                f"split_sizes for other splits")
        want = tuple(b - a for a, b in mesh_region(gshape, src, unravel(bad, mesh_shape), mesh_shape, rule))
        raise MismatchError(
            f"redistribute: {list(src)} on mesh {list(mesh_shape)} of the global shape {list(gshape)} gives the "
            f"rank {bad} the shape {list(want)}, but it holds {list(shapes[bad])}: shards must follow the {rule} rule"
        )
    return gshape


def redistribute_dtensor(x: Any, given_src: Any, dst: Any, check: bool | None) -> Any:
    """A DTensor in, a DTensor out: the change runs on the DTensor's device mesh, with its local
    tensor split as DTensor splits (torch.chunk's rule), and the result wrapped again.
    ``given_src`` (None: not given) must be the DTensor's own placements."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor import Partial as TorchPartial
    from torch.distributed.tensor import Replicate as TorchReplicate
    from torch.distributed.tensor import Shard as TorchShard

    device_mesh = x.device_mesh
    mesh = _MESHES.get(id(device_mesh))
    if mesh is None or mesh[0] is not device_mesh:
        mesh = (device_mesh, Mesh.from_torch(device_mesh))
        _MESHES[id(device_mesh)] = mesh
    mesh_shape, names = tuple(mesh[1].shape), mesh[1].names
    try:
        src = _dtensor_layout(x, mesh_shape)
    except ReshardError as exc:
        refuse("redistribute", x.to_local(), mesh[1].comm, check, exc)
    if given_src is not None:
        try:
            said = parse_placements(given_src, len(mesh_shape), names)
        except ReshardError as exc:
            said = exc
        if said != src:
            shown = given_src if isinstance(said, ReshardError) else layout_text(said)
            refuse("redistribute", x.to_local(), mesh[1].comm, check, InvalidArgument(
                f"rank {mesh[1].comm.rank}: redistribute: src={shown} contradicts the DTensor's own placements "
                f"{layout_text(src)}; leave src out (a DTensor carries its layout) or pass its placements"))
    d_pl = parse_placements(dst, len(mesh_shape), names)
    out = redistribute(x.to_local(), src, d_pl, None, mesh[1], tuple(x.shape), check, rule="chunk")
    placements = [TorchShard(p.dim) if isinstance(p, Shard) else TorchPartial(p.op) if isinstance(p, Partial)
                  else TorchReplicate() for p in d_pl]
    for d, dims in orders_of(d_pl):  # DTensor's own form of an order: _StridedShard's split factors
        from torch.distributed.tensor.placement_types import _StridedShard

        for i, m in enumerate(dims):
            factor = math.prod(mesh_shape[j] for j in dims[:i] if j > m)
            if factor > 1:
                placements[m] = _StridedShard(d, split_factor=factor)
    return DTensor.from_local(out, device_mesh, placements, run_check=False, shape=x.shape, stride=x.stride())


def _dtensor_layout(x: Any, mesh_shape: tuple[int, ...]) -> tuple:
    """A DTensor's layout as ours: its placements, with the order in which mesh dims split a
    tensor dim read from ``_StridedShard`` split factors (or its spec's ``shard_order``)."""
    plain, factors = [], {}
    for m, p in enumerate(x.placements):
        if type(p).__name__ == "_StridedShard":
            plain.append(Shard(int(p.dim)))
            factors[m] = int(p.split_factor)
        else:
            plain.append(parse_placements([p])[0])
    if not factors:
        given = getattr(getattr(x, "_spec", None), "shard_order", None) or ()
        return with_order(plain, [(int(e.tensor_dim), tuple(int(m) for m in e.mesh_dims)) for e in given])
    order: dict[int, list[int]] = {}
    for m in reversed(range(len(plain))):  # DTensor's decoding: each split factor places its mesh dim
        p = plain[m]
        if not isinstance(p, Shard):
            continue
        dims = order.setdefault(p.dim, [])
        want = factors.get(m, 1)
        for at in range(len(dims) + 1):
            if math.prod(mesh_shape[j] for j in dims[:at]) == want:
                dims.insert(at, m)
                break
        else:
            raise InvalidArgument(f"the DTensor's placements {list(x.placements)} on mesh {list(mesh_shape)} name no "
                                  "order of mesh dims: a _StridedShard's split factor must be the product of the sizes "
                                  "of the mesh dims that split its tensor dim before it")
    return with_order(plain, {d: tuple(dims) for d, dims in order.items()})


_MESHES: dict[int, tuple] = {}  # device mesh -> its reshard mesh (sub-communicators made once)
