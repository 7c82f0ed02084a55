"""``redistribute``: one implementation for a world (the mesh ``(N,)``) and an N-D mesh.

Validate (``validate.redistribute``, pure), agree, learn the global shape from the ranks'
shapes where it was not given, plan this rank's steps (``planner.redistribute``) and run them
(``execute.PlanRun``); the backward is the plan of the gradient's change back. A DTensor in is
changed on its own device mesh with DTensor's split rule, and wrapped again.
"""

from __future__ import annotations

import itertools
import math
import operator
import sys
from typing import Any

import numpy as np

from . import validate
from .comm import Comm
from .errors import InvalidArgument, MismatchError, ReshardError
from .execution import arena_reads, coalesced, execute
from .execution.agreement import compare_dims
from .execution.arrays import array_backend, check_array, dtype_name, is_numpy, is_torch, resolved, to_torch
from .execution.call import Call, refuse, replay_or_new, wants_grad
from .execution.hot_replay import MISS, replay_hot
from .mesh import Mesh
from .planning import planner
from .planning.layout import (
    Partial,
    Shard,
    dtensor_placements,
    global_shape_of,
    is_placement,
    mesh_region,
    orders_of,
    parse_placements,
    torch_layout,
    unravel,
    with_order,
)
from .planning.spec import layout_text

Array = Any


def hot_args(src: Any, dst: Any, global_shape: Any, mesh: Mesh | None, rule: str = "balanced") -> tuple:
    """The arguments a hot replay of ``redistribute`` is kept by and found by (``replay_hot``)."""
    base = (src, dst, global_shape) if mesh is None else (src, dst, global_shape, mesh, rule)
    return base + arena_reads.key_part()


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
    key = hot if world else (_key_placements(src, mesh), _key_placements(dst, mesh), global_shape, mesh.shape, rule,
                             *arena_reads.key_part())
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
        call.arg_texts = {"src": _shown(args.src, world), "dst": _shown(args.dst, world),
                          "mesh": f"{list(mesh_shape)} ({rule} rule)"}
    free = tuple(sorted({p.dim for p in args.src if isinstance(p, Shard)})) if args else ()
    if args is not None and args.src == args.dst:
        call.agree(free_dims=free, need_shapes=False, vote=True)  # src == dst here may not be so on a peer
        call.numpy_in = False
        return execute.finish(call, x)  # the caller's own object: nothing moved, nothing copied
    prepare = None
    first = planner.first_send(call.x.shape, args.src, args.dst, mesh_shape, rule) if args is not None else None
    if first is not None:  # the plan starts with the world's all_to_all: its pack, while the records travel
        prepare = execute.prepare_send(call, call.x, *first)
    needs_lengths = args is not None and args.global_shape is None and bool(free)
    # whether the lengths are needed comes from this rank's arguments (a peer's may differ): vote anyway
    shapes = call.agree(free_dims=free, need_shapes=needs_lengths, prepare=prepare, vote=True)
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


def _shown(layout: tuple, world: bool) -> str:
    """A layout as messages show it: a world's by its one placement."""
    return repr(layout[0]) if world else layout_text(layout)


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


def _tensor_global_shape(i: int, shapes: list, src: tuple, mesh_shape: tuple, rule: str, world: bool) -> tuple:
    """Tensor ``i`` of a list: its global shape from every rank's shape of it (``shapes``), its
    unsplit dims the same on every rank; a ``MismatchError`` naming the tensor where not."""
    split = {p.dim for p in src if isinstance(p, Shard)}
    try:
        compare_dims("redistribute", shapes, tuple(split))
        return _global_shape(shapes, src, mesh_shape, rule, world) if split else tuple(shapes[0])
    except MismatchError as exc:  # "redistribute: tensor i: ...", as the other checks of a list say it
        raise MismatchError(f"redistribute: tensor {i}: {str(exc).removeprefix('redistribute: ')}") from None


def redistribute_dtensor(x: Any, given_src: Any, dst: Any, check: bool | None) -> Any:
    """A DTensor in, a DTensor out: the change runs on the DTensor's device mesh, with its local
    tensor split as DTensor splits (torch.chunk's rule), and the result wrapped again.
    ``given_src`` (None: not given) must be the DTensor's own placements."""
    from torch.distributed.tensor import DTensor

    device_mesh = x.device_mesh
    mesh = (device_mesh, _reshard_mesh(device_mesh))
    mesh_shape, names = tuple(mesh[1].shape), mesh[1].names
    try:
        src = _dtensor_layout(x, mesh_shape)
    except ReshardError as exc:
        refuse("redistribute", x.to_local(), mesh[1].comm, check, exc)
    if given_src is not None:
        try:
            said = dtensor_placements(given_src, mesh_shape, names)
        except ReshardError as exc:
            said = exc
        if said != src:
            shown = given_src if isinstance(said, ReshardError) else layout_text(said)
            refuse("redistribute", x.to_local(), mesh[1].comm, check, InvalidArgument(
                f"rank {mesh[1].comm.rank}: redistribute: src={shown} contradicts the DTensor's own placements "
                f"{layout_text(src)}; leave src out (a DTensor carries its layout) or pass its placements"))
    try:
        d_pl = dtensor_placements(dst, mesh_shape, names, x.ndim)
    except ReshardError as exc:
        refuse("redistribute", x.to_local(), mesh[1].comm, check, exc)
    out = redistribute(x.to_local(), src, d_pl, None, mesh[1], tuple(x.shape), check, rule="chunk")
    return DTensor.from_local(out, device_mesh, torch_placements(d_pl, mesh_shape), run_check=False, shape=x.shape,
                              stride=x.stride())


def _reshard_mesh(device_mesh: Any) -> Mesh:
    """The reshard mesh of a torch device mesh, made once (its sub-communicators with it)."""
    mesh = _MESHES.get(id(device_mesh))
    if mesh is None or mesh[0] is not device_mesh:
        mesh = (device_mesh, Mesh.from_torch(device_mesh))
        _MESHES[id(device_mesh)] = mesh
    return mesh[1]


def torch_placements(layout: Any, mesh_shape: tuple[int, ...]) -> list:
    """Our layout in DTensor's placements; an order as ``_StridedShard`` split factors."""
    from torch.distributed.tensor import Partial as TorchPartial
    from torch.distributed.tensor import Replicate as TorchReplicate
    from torch.distributed.tensor import Shard as TorchShard

    placements = [TorchShard(p.dim) if isinstance(p, Shard) else TorchPartial(p.op) if isinstance(p, Partial)
                  else TorchReplicate() for p in layout]
    for d, dims in orders_of(layout):
        from torch.distributed.tensor.placement_types import _StridedShard

        for i, m in enumerate(dims):
            factor = math.prod(mesh_shape[j] for j in dims[:i] if j > m)
            if factor > 1:
                placements[m] = _StridedShard(d, split_factor=factor)
    return placements


def redistribute_dtensors(xs: list, given_src: Any, dst: Any, check: bool | None) -> list:
    """A list of DTensors on one device mesh changed in one call (``redistribute_many``, DTensor's
    split rule), a list of DTensors out; ``given_src`` (None: not given) must be their own placements."""
    from torch.distributed.tensor import DTensor

    first = xs[0].device_mesh
    mesh = _reshard_mesh(first)
    other = next((i for i, x in enumerate(xs) if x.device_mesh is not first), None)
    if other is not None:
        refuse("redistribute", xs[0].to_local(), mesh.comm, check, InvalidArgument(
            f"rank {mesh.comm.rank}: redistribute: tensor {other} lies on another device mesh than tensor 0; "
            "one call moves tensors of one mesh"))
    mesh_shape = tuple(mesh.shape)
    try:
        srcs = [_dtensor_layout(x, mesh_shape) for x in xs]
        dsts = [dtensor_placements(d, mesh_shape, mesh.names, x.ndim, f"tensor {i}: dst")
                for i, (x, d) in enumerate(zip(xs, _each("dst", dst, len(xs), len(mesh_shape))))]
        if given_src is not None:
            for i, (said, own) in enumerate(zip(_each("src", given_src, len(xs), len(mesh_shape)), srcs)):
                if dtensor_placements(said, mesh_shape, mesh.names) != own:
                    raise InvalidArgument(f"rank {mesh.comm.rank}: redistribute: tensor {i}: src={said} contradicts "
                                          f"the DTensor's own placements {layout_text(own)}; leave src out")
    except ReshardError as exc:
        refuse("redistribute", xs[0].to_local(), mesh.comm, check, exc)
    outs = redistribute_many([x.to_local() for x in xs], srcs, dsts, None, mesh, [tuple(x.shape) for x in xs], check,
                             rule="chunk")
    return [DTensor.from_local(out, first, torch_placements(d, mesh_shape), run_check=False, shape=x.shape,
                               stride=x.stride()) for x, out, d in zip(xs, outs, dsts)]


def _dtensor_layout(x: Any, mesh_shape: tuple[int, ...]) -> tuple:
    """A DTensor's layout as ours (``torch_layout`` of its placements and its spec's ``shard_order``)."""
    return torch_layout(x.placements, mesh_shape, getattr(getattr(x, "_spec", None), "shard_order", None) or ())


_MESHES: dict[int, tuple] = {}  # device mesh -> its reshard mesh (sub-communicators made once)


def _each(name: str, value: Any, n: int, mesh_ndim: int | None = None) -> list:
    """``src``/``dst`` for a call on ``n`` tensors: a list gives one per tensor; anything else
    (a placement, a tuple of placements, a Spec, text) is one for all. On a mesh of
    ``mesh_ndim`` dims, a list of placement objects, one per mesh dim, is one layout for all
    (as DTensor writes placements): read per tensor, it could only be refused or mean the same."""
    if isinstance(value, list) and mesh_ndim is not None and len(value) == mesh_ndim and all(map(is_placement, value)):
        return [value] * n
    if isinstance(value, list):
        if len(value) != n:
            raise InvalidArgument(f"{name} is a list of {len(value)} layouts for {n} tensors: give one per tensor, "
                                  "or one layout (not in a list) for all")
        return value
    return [value] * n


def _each_shape(global_shape: Any, n: int) -> list:
    if global_shape is None:
        return [None] * n
    if not isinstance(global_shape, (list, tuple)) or len(global_shape) != n or any(
            g is not None and not isinstance(g, (list, tuple)) for g in global_shape):
        raise InvalidArgument(f"global_shape for {n} tensors is None or a list with one shape (or None) per tensor, "
                              f"got {global_shape!r}")
    return list(global_shape)


_DTYPE, _SHAPE = operator.attrgetter("dtype"), operator.attrgetter("shape")
_TOKENS: dict[tuple, int] = {}  # a many-tensor call's full signature -> the small key its replays go by
_NEXT_TOKEN = itertools.count(1)


def _token(signature: tuple) -> int:
    """A number standing for ``signature`` (every tensor's type, dtype, shape and layouts), so
    that a replay's key is one int; a new signature gets a new number, never a used one."""
    token = _TOKENS.get(signature)
    if token is None:
        if len(_TOKENS) >= 1024:
            _TOKENS.clear()
        token = _TOKENS[signature] = next(_NEXT_TOKEN)
    return token


def redistribute_many(xs: Any, src: Any, dst: Any, comm: Comm | None, mesh: Mesh | None, global_shape: Any,
                      check: bool | None, rule: str = "balanced", types: set | None = None) -> list:
    """Every tensor of ``xs`` from its ``src`` to its ``dst`` in one call: one check for all,
    one shared exchange of boxes (``coalesced.ManyRun``), the list of results. ``types``: the
    set of the tensors' types, where the caller has it."""
    xs = list(xs)
    n = len(xs)
    world = mesh is None
    on = comm if world else mesh.comm
    try:
        mesh_ndim = None if world else len(mesh.shape)
        srcs, dsts = _each("src", src, n, mesh_ndim), _each("dst", dst, n, mesh_ndim)
        gshapes = _each_shape(global_shape, n)
    except ReshardError as exc:
        refuse("redistribute", np.zeros(1, np.int64), on, check, exc)
    kinds = set(map(type, xs)) if types is None else types
    if kinds == {np.ndarray}:  # the common case, kept cheap: it runs on every replay
        shapes: tuple = (np.ndarray, tuple(map(_DTYPE, xs)), tuple(map(_SHAPE, xs)))
    else:
        xs = [resolved(x) for x in xs]  # a lazy conjugate's values, not its memory's
        shapes = tuple([(type(x), getattr(x, "dtype", None), getattr(x, "shape", None),
                         getattr(x, "requires_grad", False)) for x in xs])
    if world:
        layouts = (src, dst) if not isinstance(src, list) and not isinstance(dst, list) else (tuple(srcs), tuple(dsts))
    else:
        layouts = tuple((_key_placements(s, mesh), _key_placements(d, mesh)) for s, d in
                        (zip(srcs, dsts) if isinstance(src, list) or isinstance(dst, list) else [(src, dst)]))
    try:
        signature = (shapes, layouts, None if global_shape is None else tuple(
            None if g is None else tuple(g) for g in gshapes), None if world else (mesh.shape, id(mesh)), rule)
        args: tuple = (_token(signature),)
    except TypeError:  # something unhashable among the arguments: no replay
        args = (object(),)
    call = Call("redistribute", np.zeros(1, np.int64), on, check, ("tensors", "layouts", "global_shape"))
    call.many = xs
    done = call.replay(args)
    if done is not MISS:
        return done
    return _many_first(call, xs, srcs, dsts, gshapes, mesh, rule)


def _many_first(call: Call, xs: list, srcs: list, dsts: list, gshapes: list, mesh: Mesh | None, rule: str) -> list:
    """A many-tensor call's full path: validate every tensor, agree once, learn the global
    shapes, plan each tensor's part, run the program, keep it for the replays."""
    world = mesh is None
    mesh_shape = (call.size,) if world else mesh.shape
    coord = (call.rank,) if world else mesh.coord
    names = None if world else mesh.names
    torch_arrays = call.arrays.name == "torch" or any(is_torch(x) for x in xs)

    def check_all(_: Any) -> list:
        out = []
        for i, (x, s, d, g) in enumerate(zip(xs, srcs, dsts, gshapes)):
            check_array(x, f"tensor {i}", need_dims=False)  # its message names the tensor
            try:
                out.append(validate.redistribute(x, s, d, mesh_shape, coord, g, rule, world, names))
            except ReshardError as exc:
                raise type(exc)(f"tensor {i}: {exc}") from None
        return out

    checked = call.validate(check_all, need_dims=False)
    call.record.tensors = len(xs)  # a rank given one tensor, or another count, is named as such
    call.numpy_in = False  # each tensor converted below, each result back
    call.arrays = array_backend("torch" if torch_arrays else "numpy")
    described = [f"{dtype_name(x)} {x.ndim}-d" if hasattr(x, "ndim") and hasattr(x, "dtype") else type(x).__name__
                 for x in xs]
    texts = [f"{_shown(a.src, world)} -> {_shown(a.dst, world)}" for a in checked] if checked is not None else []
    given = [None if a.global_shape is None else list(a.global_shape) for a in checked] if checked is not None else []
    call.record.args = tuple(validate.crc(v) for v in (described, texts, (given, mesh_shape, rule)))
    for name, value in zip(("tensors", "layouts", "global_shape"), (described, texts, given)):
        mine = validate.crc(value)
        call.arg_text[name] = lambda d, v=value, m=mine: repr(v) if d == m else "another value"
    call.per_tensor = {"tensors": ("dtype and dims", described), "layouts": ("layout", texts),
                       "global_shape": ("global_shape", [repr(g) for g in given]),
                       "input": (described, [str(list(getattr(x, "shape", ()))) for x in xs])}
    # every rank's shapes where a tensor's global shape is not given, on a first call: its split
    # dims give the global shape (a replay needs them too: ``need_shapes``), and its other dims
    # must be the same on every rank (a list's records carry no shapes, so this is where a
    # rank's different tensor is caught)
    learn = checked is not None and any(a.global_shape is None and any(isinstance(p, Shard) for p in a.src)
                                       for a in checked)
    call.agree(need_shapes=learn, vote=True)  # whether shapes are needed comes from this rank's list
    shapes_of: list[list] = []
    if checked is not None and any(a.global_shape is None for a in checked):  # one more small exchange
        mine = np.array([int(v) for x in xs for v in x.shape] or [0], dtype=np.int64)
        gathered = call.primitives.allgather_bytes(mine.view(np.uint8), "redistribute (check)")
        call.checks += 1
        call.gathered_raw = (call.gathered_raw or b"") + gathered.tobytes()
        per_rank = np.ascontiguousarray(gathered).view(np.int64)
        at = 0
        for x in xs:
            shapes_of.append([tuple(int(v) for v in row[at : at + x.ndim]) for row in per_rank])
            at += x.ndim
    sub = (lambda m: call.comm) if world else mesh.sub
    mixed = len({is_numpy(x) for x in xs}) > 1  # numpy arrays beside torch tensors: all moved as torch
    parts, gshapes_done, own = [], [], []
    # a model's tensors repeat a few shapes and layouts: each distinct one is worked out once
    # (the plans are frozen values, shared by the tensors that have them)
    learned: dict = {}  # (the ranks' shapes, src) -> global shape
    steps: dict = {}  # (global shape, src, dst) -> its exchange of boxes, or None
    plans: dict = {}  # (global shape, src, dst) -> its own plan, where the exchange cannot take it
    for i, (a, x) in enumerate(zip(checked, xs)):
        gshape = a.global_shape
        if gshape is None and shapes_of:
            seen = (tuple(shapes_of[i]), a.src)
            gshape = learned.get(seen)
            if gshape is None:
                gshape = learned[seen] = _tensor_global_shape(i, shapes_of[i], a.src, mesh_shape, rule, world)
        gshape = tuple(int(v) for v in (gshape or x.shape))
        gshapes_done.append(gshape)
        size = call.arrays.itemsize(x) if not is_numpy(x) else x.dtype.itemsize
        for v in gshape:
            size *= v
        if a.src == a.dst:
            parts.append(coalesced.Part("same", global_bytes=size))
            continue
        key = (gshape, a.src, a.dst)
        if key not in steps:
            steps[key] = planner.exchange_boxes(gshape, a.src, a.dst, mesh_shape, call.rank, rule)
        step = steps[key]
        if step is not None:
            moved = to_torch(x) if mixed and is_numpy(x) else x  # numpy beside torch moves as torch
            group = (type(moved), str(moved.dtype), tuple(x.shape), a.src, a.dst, gshape)
            parts.append(coalesced.Part("boxes", step=step, global_bytes=size, group=group))
            continue
        own.append(i)
        plan = plans.get(key)
        if plan is None:
            plan = plans[key] = planner.redistribute(gshape, a.src, a.dst, mesh_shape, call.rank, rule)
        data = _detached(to_torch(x) if torch_arrays and is_numpy(x) else x)
        parts.append(coalesced.Part("own", run=execute.PlanRun(call, data, plan, sub, mesh_shape=mesh_shape),
                                    global_bytes=size))
    own_set = set(own)
    grad_on = torch_arrays and any(is_torch(x) for x in xs)
    plain = not own_set and not grad_on and not mixed  # one kind, off the tape: the inputs as they are

    def as_moved(given: list) -> list:
        """The inputs as the program moves them: off the tape, and as torch where kinds mix or
        a tensor takes its own steps."""
        return [(_detached(to_torch(x) if torch_arrays and is_numpy(x) else x) if mixed or i in own_set
                 else _detached(x)) for i, x in enumerate(given)]

    # the program is made from the inputs as it will move them (an engine's forms take their kind)
    program = coalesced.ManyRun(parts, [x.dtype.itemsize if is_numpy(x) else x.element_size() for x in xs], call.rank,
                                call, as_moved(xs))
    backs = [(with_order([planner.backward_placements(p, q)[0] for p, q in zip(a.src, a.dst)], orders_of(a.dst)),
              with_order([planner.backward_placements(p, q)[1] for p, q in zip(a.src, a.dst)], orders_of(a.src)))
             for a in checked]

    def run(k: Call, _: Any, prepared: Any = None) -> list:
        given = k.many
        if plain:
            return program(k, given, prepared)
        inputs = as_moved(given)
        outs = program(k, inputs)
        results = []
        taped = grad_on and sys.modules["torch"].is_grad_enabled()
        for i, (x, out) in enumerate(zip(given, outs)):
            if out is inputs[i]:
                results.append(x)  # nothing moved: the caller's own object
                continue
            if is_numpy(x) and not is_numpy(out):
                out = out.numpy()
            elif taped and x.requires_grad:
                from .execution import autograd

                out = autograd.attach(x, out, _reverse(k.comm, mesh, backs[i], gshapes_done[i], rule, world))
            results.append(out)
        return results

    out = run(call, None)
    # a replay joins the inputs (its local work) while its check travels
    call.remember(run, prepare=(lambda k, _: program.prepare(k, k.many)) if plain else None)
    return call.result(out)


def _detached(x: Any) -> Any:
    return x.detach() if getattr(x, "requires_grad", False) else x


def _reverse(comm: Comm, mesh: Mesh | None, back: tuple, gshape: tuple, rule: str, world: bool) -> Any:
    """The gradient's change back for one tensor of a many-tensor call, unchecked."""
    back_src, back_dst = back

    def reverse(g: Any) -> Any:
        if back_src == back_dst:
            return g
        if world:
            return redistribute(g, back_src[0], back_dst[0], comm, None, gshape, False, rule)
        return redistribute(g, back_src, back_dst, None, mesh, gshape, False, rule)

    return reverse
